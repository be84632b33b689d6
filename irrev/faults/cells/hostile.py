"""Hostile input: every request must get a clear 4xx and change nothing. Each run
first makes one honest order (so the tenant has holds, accounts and a journal),
then DUMPs every key of the tenant, sends the hostile requests, and compares: the
keys must be byte-identical and the upstream must have seen no new request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ..bench import Run
from ..checks import check_ledger, snapshot
from ..matrix import Cell

Attack = Callable[[Run, Any], Awaitable[list[str]]]
Setup = Callable[[Run], Awaitable[Any]]
PROBLEM = "application/problem+json"


def _body(**fields: Any) -> dict[str, Any]:
    return {"supplier_id": "s1", "sku": "bolts", "quantity": 2, "unit_price": 5, **fields}


def expect_4xx(
    what: str, response: httpx.Response | int, allowed: tuple[int, ...] = ()
) -> list[str]:
    status = response if isinstance(response, int) else response.status_code
    if not 400 <= status < 500 or (allowed and status not in allowed):
        text = "" if isinstance(response, int) else response.text[:160]
        return [f"{what}: got {status} {text}, want {allowed or '4xx'}"]
    # 400s may come from the HTTP parser itself; the gateway's own are problems.
    if isinstance(response, httpx.Response) and status != 400:
        ctype = response.headers.get("content-type", "")
        return [] if ctype.startswith(PROBLEM) else [f"{what}: {status} is not problem+json"]
    return []


async def post_raw(
    run: Run, body: bytes, content_type: str = "application/json", **headers: str
) -> httpx.Response:
    sent = {
        **run.agent_headers(),
        "Idempotency-Key": uuid.uuid4().hex,
        "Content-Type": content_type,
        **headers,
    }
    return await run.bench.http.post(
        f"{run.url()}/tools/supplier/orders", content=body, headers=sent
    )


async def post_json(run: Run, what: str, body: Any, allowed: tuple[int, ...] = ()) -> list[str]:
    text = body if isinstance(body, bytes) else json.dumps(body).encode()
    return expect_4xx(what, await post_raw(run, text), allowed)


async def raw_http(run: Run, request: bytes) -> int:
    """Send bytes as they are; the status of the answer (0: closed without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", run.bench.gateways[0].port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0


def raw_order(run: Run, headers: list[str], body: bytes | None = None) -> bytes:
    content = body if body is not None else json.dumps(_body()).encode()
    token = run.tokens[run.tenant]["buyer-01"]
    lines = [
        "POST /tools/supplier/orders HTTP/1.1",
        f"Host: 127.0.0.1:{run.bench.gateways[0].port}",
        f"Authorization: Bearer {token}",
        "Content-Type: application/json",
        *headers,
    ]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"Content-Length: {len(content)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + content


def hostile(attack: Attack, setup: Setup | None = None) -> Callable[[Run], Awaitable[list[str]]]:
    async def body(run: Run) -> list[str]:
        key = uuid.uuid4().hex
        seed = await run.order(key)
        if seed.status_code != 201:
            return [f"the honest order got {seed.status_code}"]
        ready = await setup(run) if setup is not None else None
        before, requests = await snapshot(run), (await run.supplier_stats())["requests"]
        found = await attack(run, ready)
        after = await snapshot(run)
        if after != before:
            found.append(f"written: {', '.join(before.diff(after))}")
        if (await run.supplier_stats())["requests"] != requests:
            found.append("the upstream got a request")
        return found + await check_ledger(run, [run.hold_id(key)])

    return body


# -- the attacks -------------------------------------------------------------------


async def oversized(run: Run, ready: Any) -> list[str]:
    big = json.dumps(_body(sku="x" * 70_000)).encode()
    found = expect_4xx("70 KB body", await post_raw(run, big), (413,))

    async def chunks() -> Any:
        for _ in range(100):
            yield b" " * 1000

    streamed = await run.bench.http.post(
        f"{run.url()}/tools/supplier/orders",
        content=chunks(),
        headers={
            **run.agent_headers(),
            "Idempotency-Key": "k1",
            "Content-Type": "application/json",
        },
    )
    return found + expect_4xx("100 KB chunked body", streamed, (413,))


async def lying_length(run: Run, ready: Any) -> list[str]:
    found = []
    for length in ("999999999999", "-1", "12abc", "1e3"):
        status = await raw_http(run, raw_order(run, [f"Content-Length: {length}"], b"{}"))
        found += expect_4xx(f"Content-Length: {length}", status, (400, 413))
    return found


async def deep_nesting(run: Run, ready: Any) -> list[str]:
    deep = (
        b'{"supplier_id":"s1","sku":' + b"[" * 5000 + b"]" * 5000 + b',"quantity":2,"unit_price":5}'
    )
    found = await post_json(run, "5000 levels", deep, (400,))
    just_over = b'{"x":' + b"[" * 40 + b"]" * 40 + b"}"
    return found + await post_json(run, "41 levels", just_over, (400,))


async def non_json(run: Run, ready: Any) -> list[str]:
    found = expect_4xx("text/plain", await post_raw(run, b"quantity=2", "text/plain"), (415,))
    found += expect_4xx("no content type", await post_raw(run, b"{}", ""), (415,))
    for what, body in {
        "truncated": b'{"quantity": 2',
        "invalid utf-8": b'{"sku": "\xff\xfe"}',
        "utf-16": json.dumps(_body()).encode("utf-16"),
        "trailing garbage": json.dumps(_body()).encode() + b"}{",
        "top-level array": b"[1, 2]",
        "top-level string": b'"hello"',
        "single quotes": b"{'quantity': 2}",
        "bare NUL": b"\x00",
    }.items():
        found += await post_json(run, what, body)
    return found


async def nan_infinity(run: Run, ready: Any) -> list[str]:
    found = []
    for field in ("quantity", "unit_price"):
        for word in ("NaN", "Infinity", "-Infinity"):
            body = json.dumps(_body()).replace(f'"{field}": ', f'"{field}": {word}, "_": ')
            found += await post_json(run, f"{field} {word}", body.encode(), (400,))
    return found


async def negative_amounts(run: Run, ready: Any) -> list[str]:
    found = []
    for fields in (
        {"quantity": -2},
        {"unit_price": -5},
        {"quantity": -2, "unit_price": -5},
        {"unit_price": -0.000001},
        {"quantity": 2, "unit_price": "-5"},
    ):
        found += await post_json(run, f"{fields}", _body(**fields))
    return found


async def huge_amounts(run: Run, ready: Any) -> list[str]:
    found = []
    for raw in ("1e400", "1e308", str(10**40), str(2**63), "9007199254740993"):
        body = json.dumps(_body()).replace('"quantity": 2', f'"quantity": {raw}')
        found += await post_json(run, f"quantity {raw}", body.encode())
    found += await post_json(run, "price 1e30", _body(unit_price=10**30))
    return found


async def wrong_types(run: Run, ready: Any) -> list[str]:
    found = []
    # Numbers as JSON strings ("2") are read as numbers, exactly, and forwarded as sent.
    for value in (True, None, [2], {"n": 2}, "", "two", "0x10", "1,000", "NaN"):
        found += await post_json(run, f"quantity {value!r}", _body(quantity=value))
    found += await post_json(
        run, "missing quantity", {"supplier_id": "s1", "sku": "b", "unit_price": 5}
    )
    return found


async def duplicate_keys(run: Run, ready: Any) -> list[str]:
    body = b'{"supplier_id":"s1","sku":"b","quantity":1,"unit_price":5,"quantity":1000}'
    return await post_json(run, "quantity twice", body, (400,))


async def unicode_ids(run: Run, ready: Any) -> list[str]:
    found = []
    for supplier in ("s\u017f1", "s1\u202e", "s1\u0000", "\U0001f600", "s" * 300, "s1}:x{", "s1 x"):
        found += await post_json(run, f"supplier_id {supplier[:12]!r}", _body(supplier_id=supplier))
    for key in ("k\u00e9", "k\x7f", "", "k" * 300, "k k", "k\u202e"):
        request = raw_order(run, [f"Idempotency-Key: {key}"])
        found += expect_4xx(f"Idempotency-Key {key[:12]!r}", await raw_http(run, request), (400,))
    return found


async def header_injection(run: Run, ready: Any) -> list[str]:
    key = uuid.uuid4().hex
    found = []
    for what, headers in {
        "LF inside a value": [f"Idempotency-Key: {key}\nX-Injected: 1"],
        "obs-fold": [f"Idempotency-Key: {key}", " X-Injected: 1"],
        "NUL in a value": [f"Idempotency-Key: {key}\x00x"],
        "CL and TE": [f"Idempotency-Key: {key}", "Transfer-Encoding: chunked", "Content-Length: 5"],
        "two lengths": [f"Idempotency-Key: {key}", "Content-Length: 5", "Content-Length: 60"],
        "two keys": [f"Idempotency-Key: {key}", f"Idempotency-Key: {key}x"],
        "space before colon": [f"Idempotency-Key : {key}"],
    }.items():
        found += expect_4xx(what, await raw_http(run, raw_order(run, headers)))
    return found


async def escalate_in_two_tenants(run: Run) -> tuple[str, str, str]:
    other = f"{run.tenant[:40]}-b"
    await run.add_tenant(other)
    key = f"esc-{uuid.uuid4().hex}"
    escalated = await run.order(key, quantity=80)
    if escalated.status_code != 202:
        raise RuntimeError(f"not escalated: {escalated.status_code}")
    return other, run.hold_id(key), escalated.json()["escalation"]


async def cross_tenant(run: Run, ready: Any) -> list[str]:
    other, hold_id, escalation = ready
    before_b = await snapshot(run, other)
    theirs = run.agent_headers(tenant=other)
    http, url = run.bench.http, run.url()
    found = []
    for what, response in {
        "read A's hold": await http.get(f"{url}/v1/holds/{hold_id}", headers=theirs),
        "void A's hold": await http.post(f"{url}/v1/holds/{hold_id}/void", headers=theirs),
        "post A's hold": await http.post(f"{url}/v1/holds/{hold_id}/post", headers=theirs, json={}),
        "poll A's escalation": await http.get(f"{url}/v1/escalations/{escalation}", headers=theirs),
        "poll A's hold as B's": await http.get(
            f"{url}/v1/escalations/{other}.{hold_id}", headers=theirs
        ),
        "approve as an agent": await http.post(
            f"{url}/v1/escalations/{escalation}/approve", headers=theirs
        ),
        "A's balances": await http.get(
            f"{url}/v1/admin/tenants/{run.tenant}/balances", headers=theirs
        ),
        "reconcile A": await http.post(
            f"{url}/v1/admin/tenants/{run.tenant}/reconcile", headers=theirs
        ),
    }.items():
        found += expect_4xx(what, response, (401, 403, 404))
    if await snapshot(run, other) != before_b:
        found.append("tenant B's keys changed")
    return found


async def escalate_and_approve(run: Run) -> tuple[str, str]:
    key = uuid.uuid4().hex
    escalated = await run.order(key, quantity=80)
    path = f"/v1/escalations/{escalated.json()['escalation']}"
    if (first := await run.admin("POST", f"{path}/approve")).status_code != 201:
        raise RuntimeError(f"the approval got {first.status_code}")
    return path, key


async def replayed_approval(run: Run, ready: Any) -> list[str]:
    path, key = ready
    found = []
    for attempt in ("approve", "approve", "reject", "approve"):
        found += expect_4xx(
            f"replayed {attempt}", await run.admin("POST", f"{path}/{attempt}"), (409,)
        )
    if (forwards := await run.forwards(run.hold_id(key))) != 1:
        found.append(f"forwarded {forwards} times")
    return found


async def bad_credentials(run: Run, ready: Any) -> list[str]:
    http, url = run.bench.http, f"{run.url()}/tools/supplier/orders"
    body = json.dumps(_body()).encode()
    found = []
    for what, auth in {
        "no token": None,
        "empty bearer": "Bearer",
        "wrong token": "Bearer irrev_wrong",
        "basic": "Basic YWRtaW46YWRtaW4=",
        "admin token as agent": f"Bearer {run.bench.admin_token}",
        "10 KB token": "Bearer " + "a" * 10_000,
        "two tokens": f"Bearer {run.tokens[run.tenant]['buyer-01']} x",
    }.items():
        headers = {"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        found += expect_4xx(what, await http.post(url, content=body, headers=headers), (401, 431))
    agent = run.agent_headers()
    for path in ("/v1/admin/tenants", f"/v1/admin/tenants/{run.tenant}/reconcile"):
        response = await http.request(
            "GET" if path.endswith("tenants") else "POST", f"{run.url()}{path}", headers=agent
        )
        found += expect_4xx(f"agent token on {path}", response, (401,))
    return found


async def order_once(run: Run) -> str:
    key = uuid.uuid4().hex
    if (first := await run.order(key)).status_code != 201:
        raise RuntimeError(f"first order got {first.status_code}")
    return key


async def idempotency_conflict(run: Run, ready: Any) -> list[str]:
    found = []
    for quantity in (3, 1, 80):
        response = await run.order(ready, quantity=quantity)
        found += expect_4xx(f"same key, quantity {quantity}", response, (409,))
    response = await run.order(ready, quantity=200)  # above the agent's cap: refused first
    return found + expect_4xx("same key, quantity 200", response, (403, 409))


async def unknown_routes(run: Run, ready: Any) -> list[str]:
    http, headers = run.bench.http, {**run.agent_headers(), "Idempotency-Key": "k"}
    found = []
    for method, path in (
        ("POST", "/tools/supplier/admin"),
        ("POST", "/tools/nope/orders"),
        ("PUT", "/tools/supplier/orders"),
        ("DELETE", "/tools/supplier/orders/o-1"),
        ("POST", "/tools/supplier/orders/%2e%2e/%2e%2e/v1/admin/tenants"),
        ("POST", "/tools/supplier/%2Forders"),
        ("POST", "/tools/supplier/orders%00"),
        ("POST", "/tools/supplier/ORDERS"),
        ("POST", "/tools/supplier/orders/\u202e"),
        ("TRACE", "/tools/supplier/orders"),
    ):
        response = await http.request(method, f"{run.url()}{path}", headers=headers, json=_body())
        found += expect_4xx(f"{method} {path}", response, (403, 404, 405, 422))
    return found


async def forged_ids(run: Run, ready: Any) -> list[str]:
    http, url, agent = run.bench.http, run.url(), run.agent_headers()
    found = []
    for hold in ("x" * 5000, "..%2F..%2Facct", "h*", "h}:acct:{x", "%00", "h%20h", "\u00e9"):
        found += expect_4xx(
            f"hold {hold[:12]!r}", await http.get(f"{url}/v1/holds/{hold}", headers=agent)
        )
        found += expect_4xx(
            f"void {hold[:12]!r}", await http.post(f"{url}/v1/holds/{hold}/void", headers=agent)
        )
    for escalation in (
        "nope",
        f"{run.tenant}.",
        f".{'a' * 40}",
        f"{run.tenant}.h*",
        "*.*",
        f"{run.tenant}}}.x",
    ):
        response = await run.admin("POST", f"/v1/escalations/{escalation}/approve")
        found += expect_4xx(f"approve {escalation[:20]!r}", response, (404, 422))
    return found


async def decision_api(run: Run, ready: Any) -> list[str]:
    http, url = run.bench.http, f"{run.url()}/v1/holds"
    headers = {**run.agent_headers(), "Idempotency-Key": uuid.uuid4().hex}
    valid = {"tool": "supplier", "method": "POST", "path": "/orders", "body": _body()}
    found = []
    for what, spec in {
        "extra field": {**valid, "amount_micros": 1},
        "method TRACE": {**valid, "method": "TRACE"},
        "relative path": {**valid, "path": "orders"},
        "tool as a list": {**valid, "tool": ["supplier"]},
        "query of ints": {**valid, "query": {"a": 1}},
        "body a list": {**valid, "body": [1]},
        "a proxied route": valid,
    }.items():
        found += expect_4xx(what, await http.post(url, json=spec, headers=headers), (403, 422))
    return found


def _cell(name: str, checked: str, attack: Attack, setup: Setup | None = None) -> Cell:
    return Cell(
        name=f"hostile.{name}",
        checked=f"{checked} -> 4xx, nothing written or sent",
        body=hostile(attack, setup),
    )


CELLS = [
    _cell("oversized_body", "70 KB body, 100 KB chunked", oversized),
    _cell("lying_content_length", "huge/negative/garbage Content-Length", lying_length),
    _cell("deep_nesting", "5000 and 41 levels of JSON", deep_nesting),
    _cell("non_json", "text/plain, truncated, bad UTF-8, UTF-16, garbage", non_json),
    _cell("nan_infinity", "NaN, Infinity, -Infinity amounts", nan_infinity),
    _cell(
        "negative_amounts", "negative, zero, negative*negative, string amounts", negative_amounts
    ),
    _cell("huge_amounts", "1e400, 10**40, 2**63, 1e-400 amounts", huge_amounts),
    _cell("wrong_types", "strings, bools, null, lists for numbers", wrong_types),
    _cell("duplicate_json_keys", "quantity given twice", duplicate_keys),
    _cell("odd_unicode_ids", "unicode/NUL/RTL/long supplier ids and keys", unicode_ids),
    _cell("header_injection", "LF, obs-fold, NUL, CL+TE, two CL, two keys", header_injection),
    _cell(
        "cross_tenant",
        "B's agent token on A's holds/escalations/admin",
        cross_tenant,
        escalate_in_two_tenants,
    ),
    _cell(
        "replayed_approval",
        "approve x3 + reject after an approval",
        replayed_approval,
        escalate_and_approve,
    ),
    _cell("bad_credentials", "no/wrong/basic/admin/huge tokens; agent on admin", bad_credentials),
    _cell("idempotency_conflict", "same key, different body", idempotency_conflict, order_once),
    _cell("unknown_routes", "unknown tool/route/method, encoded traversal", unknown_routes),
    _cell("forged_ids", "hold/escalation ids with globs, braces, traversal", forged_ids),
    _cell("decision_api_schema", "extra fields, wrong types, proxied route", decision_api),
]
