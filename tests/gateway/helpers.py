"""Small helpers of the gateway tests: orders, problems, balances, supplier counts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx

from gateway.state.policies import policy_version
from gateway.state.tenants import TenantStore
from ledger import Ledger
from ledger.keys import accounts_key, policy_key, policy_log_key, policy_sources_key

from .conftest import PEERS
from .servers import BIN, Tenant, Tenanted, base_env, write_policy

PROBLEM_JSON = "application/problem+json"


def order(
    quantity: int = 10, unit_price: str = "100", supplier_id: str = "s1", sku: str = "bolts"
) -> dict[str, Any]:
    """A supplier order; its face value is quantity * unit_price USD."""
    return {"supplier_id": supplier_id, "sku": sku, "quantity": quantity, "unit_price": unit_price}


def effect_headers(tenant: Tenant, agent: str, key: str) -> dict[str, str]:
    return {**tenant.auth(agent), "Idempotency-Key": key}


DEPLOY = {"tool": "deploy", "method": "POST", "path": "/deploys"}
MCP_PROTOCOL = "2026-07-28"


def mcp_call(tenant: Tenant, agent: str, name: str) -> tuple[bytes, dict[str, str]]:
    """A raw MCP tools/call of `name` by `agent` (stateless, the 2026-07-28 protocol)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MCP_PROTOCOL,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": meta},
    }
    headers = {
        **tenant.auth(agent),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MCP_PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    return json.dumps(message).encode(), headers


async def scrape_hosts(http: httpx.AsyncClient, headers: dict[str, str]) -> list[str]:
    """/metrics of the gateway `http` talks to and of each live peer gateway, one text
    each."""
    response = await http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    texts = [response.text]
    for peer in PEERS:  # a lease the peer took: its tenants' gauges are there
        texts.append((await http.get(f"{peer}/metrics", headers=headers)).text)
    return texts


async def scrape_fleet(
    http: httpx.AsyncClient, headers: dict[str, str], series: str, within_s: float = 15.0
) -> str:
    """/metrics once it shows `series` (a text the exposition must contain), or as
    last read. A scrape by anyone but an operator may answer with the fleet gauges
    another such scrape read up to IRREV_METRICS_CACHE_S before. (A tenant's gauges
    come from the gateway whose worker holds its sweep lease; one nobody holds is
    taken by the scrape: tests/gateway/test_sweeper.py; with a peer gateway up, its
    scrape is read too.)"""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        text = "\n".join(await scrape_hosts(http, headers))
        if series in text or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.2)


async def deploy_hold(http: httpx.AsyncClient, tenant: Tenant, key: str) -> tuple[str, int]:
    """deployer-01 asks the decision API for a deploy (an in-process irreversible
    route): the new hold's id and its price."""
    headers = effect_headers(tenant, "deployer-01", key)
    created = await http.post("/v1/holds", json=DEPLOY, headers=headers)
    assert created.status_code == 201, created.text
    return created.json()["hold"], int(created.headers["x-irrev-price"])


def assert_problem(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    """`response` is the gateway's own refusal, whole (docs/policy.md, "Reason codes";
    the Problem schema of the OpenAPI document): problem+json with every member
    RFC 9457 gives it (type, title, status: the HTTP status, detail) and its reason,
    marked with the same code in X-Irrev-Reason, without which an agent's client
    takes it for the tool's own answer (irrev/client.py). Live, repeated or polled."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["reason"] == reason, body
    assert response.headers.get("x-irrev-reason") == reason, dict(response.headers)
    assert body.get("status") == status, body
    assert body.get("type") == f"https://irrev.dev/problems/{reason}", body
    assert body.get("title") == reason.replace("_", " "), body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    return body


def assert_mcp_refusal(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    """`response` is the gateway's refusal of an MCP POST before the SDK read it: its
    HTTP status, and a body that is both the problem document (every member
    `assert_problem` checks) and a JSON-RPC error with no id, in application/json, the
    one shape an MCP client reads a non-2xx body in: its message is the model's text."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers.get("x-irrev-reason") == reason, dict(response.headers)
    body: dict[str, Any] = response.json()
    assert body["reason"] == reason and body.get("status") == status, body
    assert body.get("type") == f"https://irrev.dev/problems/{reason}", body
    assert body.get("title") == reason.replace("_", " "), body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    assert body["jsonrpc"] == "2.0" and body["id"] is None, body
    assert body["error"]["message"] == f"irrev did not make this call: {body['detail']}", body
    assert body["error"]["data"]["reason"] == reason, body
    return body


async def balances(
    http: httpx.AsyncClient, admin: dict[str, str], tenant: Tenanted
) -> dict[str, Any]:
    response = await http.get(f"/v1/admin/tenants/{tenant.id}/balances", headers=admin)
    assert response.status_code == 200, response.text
    return {row["account"]: row for row in response.json()}


def used(rows: dict[str, Any]) -> dict[str, int]:
    """pending + posted of every account that has any (an account opened on first use
    with nothing on it compares equal to no account)."""
    totals = {account: row["pending"] + row["posted"] for account, row in rows.items()}
    return {account: total for account, total in totals.items() if total}


def assert_no_overdraw(rows: dict[str, Any]) -> None:
    over = {a: r for a, r in rows.items() if r["pending"] + r["posted"] > r["limit"]}
    assert not over, over


async def holds_in(
    http: httpx.AsyncClient, admin: dict[str, str], tenant: Tenanted, state: str
) -> dict[str, Any]:
    response = await http.get(
        f"/v1/admin/tenants/{tenant.id}/holds", params={"state": state}, headers=admin
    )
    assert response.status_code == 200, response.text
    return {hold["hold"]: hold for hold in response.json()}


async def send_order(
    http: httpx.AsyncClient, tenant: Tenant, key: str, quantity: int = 10
) -> httpx.Response:
    """One supplier order by buyer-01 under Idempotency-Key `key`."""
    return await http.post(
        "/tools/supplier/orders",
        json=order(quantity=quantity),
        headers=effect_headers(tenant, "buyer-01", key),
    )


async def orders_made(upstream: httpx.AsyncClient, tenant: Tenant) -> int:
    """How many orders the supplier made for `tenant`."""
    return int((await supplier_stats(upstream, tenant))["orders"])


async def supplier_stats(upstream: httpx.AsyncClient, tenant: Tenant) -> dict[str, Any]:
    response = await upstream.get(f"/{tenant.id}/_stats")
    assert response.status_code == 200
    stats: dict[str, Any] = response.json()
    return stats


async def set_faults(upstream: httpx.AsyncClient, tenant: Tenant, **faults: Any) -> None:
    response = await upstream.post(f"/{tenant.id}/_faults", json=faults)
    assert response.status_code == 200, response.text


def ledger_audit(redis_url: str, *tenants: Tenanted) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "irrev"), "ledger", "audit"]
    for tenant in tenants:
        argv += ["--tenant", tenant.id]
    return subprocess.run(
        argv,
        env=base_env(IRREV_REDIS_URL=redis_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def raw_request(
    base_url: str, method: str, target: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request with `target` sent byte for byte (an HTTP client would
    normalise dot segments away): status, headers (lower-case names) and body."""
    url = httpx.URL(base_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {url.host}:{url.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + body)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, rest = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in parsed.items()}, rest


async def trickled_request(
    base_url: str,
    target: str,
    headers: dict[str, str],
    body: bytes,
    every_s: float = 0.2,
    sending_s: float = 0.5,
) -> tuple[int, dict[str, Any]]:
    """A POST whose body a slow client sends one byte every `every_s` (a slow loris)
    for `sending_s` (less than the server's body deadline), then holds the connection
    open with the body unfinished until the server answers: its status and JSON body.
    It stops sending before the deadline because bytes that reach a server after it
    stopped reading make its kernel answer the close with a reset, which can discard
    the answer before this client reads it (CI saw ConnectionResetError so)."""
    url = httpx.URL(base_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)

    async def trickle() -> None:
        lines = [f"POST {target} HTTP/1.1", f"Host: {url.host}:{url.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"Content-Length: {len(body)}", "", ""]
        with contextlib.suppress(ConnectionError):  # the server may answer and close
            writer.write("\r\n".join(lines).encode("latin-1"))
            for i in range(min(len(body) - 1, int(sending_s / every_s))):
                writer.write(body[i : i + 1])
                await writer.drain()
                await asyncio.sleep(every_s)

    sending = asyncio.create_task(trickle())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        status_line, *header_lines = head.decode("latin-1").strip().split("\r\n")
        parsed = {k.lower(): v for k, v in (line.split(": ", 1) for line in header_lines)}
        content = await reader.readexactly(int(parsed["content-length"]))
    finally:
        sending.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    payload: dict[str, Any] = json.loads(content)
    return int(status_line.split()[1]), payload


def base_of(shown: httpx.Response) -> dict[str, str]:
    """The If-Match of a policy change made from `shown` (a GET of the policy): the
    store version it names (docs/design.md, "Policy changes")."""
    return {"If-Match": shown.headers["etag"]} if "etag" in shown.headers else {}


async def based(http: httpx.AsyncClient, tenant: str, headers: dict[str, str]) -> dict[str, str]:
    """`headers` with the If-Match of a change made from the policy the host serves."""
    shown = await http.get(f"/v1/admin/tenants/{tenant}/policy", headers=headers)
    return {**headers, **base_of(shown)}


class FakeClock:
    """A monotonic clock a test moves by hand (`now`), for what schedules its reads."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class LoadedStore:
    """A host's TenantStore on a FakeClock, with one agent of the tenant it loaded."""

    store: TenantStore
    clock: FakeClock
    agent: str
    token: str


async def loaded_store(ledger: Ledger, directory: Path, tenant: str) -> LoadedStore:
    """`tenant`'s procurement policy written in `directory` and loaded by a host."""
    written = write_policy(directory, "procurement", tenant, "http://127.0.0.1:9")
    agent, token = next(iter(written.tokens.items()))
    store = TenantStore(directory)
    store.clock = clock = FakeClock()
    await store.load(ledger)
    return LoadedStore(store, clock, agent, token)


async def write_without_epoch_bump(ledger: Ledger, tenant: str, text: str) -> None:
    """What a policy writer that died before its epoch's INCR leaves: the script's
    write alone (policy_put.lua), over the stored version."""
    record = (await ledger.policies.records([tenant]))[tenant]
    source = files("ledger.lua").joinpath("policy_put.lua").read_text(encoding="utf-8")
    put = ledger.redis.register_script(source)
    args = [str(record.version), record.digest, policy_version(text), text, "a writer that died"]
    args += ["", "", "5"]
    keys = [policy_key(tenant), policy_log_key(tenant), policy_sources_key(tenant)]
    keys.append(accounts_key(tenant))
    won, *_ = await put(keys=keys, args=args)
    assert int(won) == 1
