"""The proxy's everyday behaviour: health, budget headers, read routes, and bad input,
which never gets a 500, always `application/problem+json` with a reason, and never
debits anything or reaches the upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
import pytest

from ledger.limits import MAX_AMOUNT
from pricing import minor_to_major_text

from .conftest import MAX_BODY_BYTES, Gateway, TenantMaker
from .helpers import (
    assert_problem,
    balances,
    effect_headers,
    holds_in,
    order,
    raw_request,
    scrape_fleet,
    supplier_stats,
    trickled_request,
    used,
)
from .servers import Tenant


@pytest.fixture(scope="module")
def basics_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("basics")


@pytest.fixture(scope="module")
def cookies_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("cookies")


@pytest.fixture(scope="module")
def bad_input_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("bad-input")


@pytest.fixture(scope="module")
def paths_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("paths")


@pytest.fixture(scope="module")
def unknown_routes_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("unknown-routes", "globex")


# Unknown routes priced, deploy among the tools: it has no upstream to forward to.
@pytest.fixture(scope="module")
def unknown_no_upstream_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant(
        "unknown-no-upstream",
        unknown_routes={"action": "price_as_irreversible", "face_value": "amount"},
    )


async def test_health_ready_and_metrics(
    basics_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    tenant = basics_tenant
    await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-01", "m1")
    )
    live = f'irrev_live_holds{{state="pending",tenant="{tenant.id}"}}'
    text = await scrape_fleet(http, gateway.admin, live)
    assert (
        'irrev_decisions_total{decision="admit",mode="enforce",reason="within_budget",'
        f'tenant="{tenant.id}"}}' in text
    )
    assert 'irrev_upstream_outcomes_total{fate="delivered",tool="supplier"}' in text
    assert live in text


async def test_admitted_effect_is_forwarded_with_budget_headers(
    basics_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = basics_tenant
    before = used(await balances(http, gateway.admin, tenant))
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=10),
        headers=effect_headers(tenant, "buyer-02", "h1"),
    )
    assert response.status_code == 201, response.text
    assert response.json()["quantity"] == 10
    price = int(response.headers["x-irrev-price"])
    hold = response.headers["x-irrev-hold"]
    assert response.headers["x-irrev-decision"] == "admit"
    assert 0 < price <= 1000 * 10**6  # at most the face value, 1000 USD in micros
    after = used(await balances(http, gateway.admin, tenant))
    for account in (
        "tenant:" + tenant.id,
        "principal:procurement",
        "agent:buyer-02",
        "factor:supplier:s1",
    ):
        assert after[account] - before.get(account, 0) == price, account
    assert int(response.headers["x-irrev-remaining"]) >= 0
    assert hold in await holds_in(http, gateway.admin, tenant, "posted")
    stats = await supplier_stats(upstream, tenant)
    assert f"irrev-{hold}" in stats["keys"]


async def test_upstream_cookies_are_never_carried_to_other_requests(
    cookies_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """The gateway's upstream client is shared by every tenant and agent: a cookie one
    answer sets must not ride along on anyone's next request (and what is forwarded
    must stay exactly what was priced)."""
    tenant = cookies_tenant
    name = tenant.supplier.rsplit("/", 1)[1]
    for i, agent in enumerate(("buyer-01", "buyer-02", "buyer-01")):
        response = await http.post(
            "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, agent, f"c{i}")
        )
        assert response.status_code == 201, response.text
        assert "set-cookie" not in response.headers, response.headers.raw
    assert (await supplier_stats(upstream, tenant))["orders"] == 3
    assert (await upstream.get(f"/_cookies/{name}")).json() == []


async def test_read_route_is_forwarded_without_a_hold(
    basics_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = basics_tenant
    before = await balances(http, gateway.admin, tenant)
    requests_before = (await supplier_stats(upstream, tenant))["requests"]
    response = await http.get("/tools/supplier/catalog", headers=tenant.auth("buyer-03"))
    assert response.status_code == 200
    assert response.json() == {"skus": ["steel-coil", "bolts", "paint"]}
    assert response.headers["x-irrev-price"] == "0"
    assert "x-irrev-hold" not in response.headers
    assert await balances(http, gateway.admin, tenant) == before
    # A read needs no Idempotency-Key and creates no order.
    assert (await supplier_stats(upstream, tenant))["requests"] == requests_before


def deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


ORDER = json.dumps(order()).encode()
USD = 10**6


def order_of(face_value_micros: int) -> bytes:
    """An order of one unit whose face value is `face_value_micros` micro-USD."""
    unit_price = minor_to_major_text(face_value_micros, USD)
    return json.dumps(order(quantity=1, unit_price=unit_price)).encode()


BAD_INPUT = [
    # (id, method, path, headers, body, status, reason)
    ("unknown-route", "POST", "/tools/supplier/invoices", {}, ORDER, 403, "unknown_route"),
    ("unknown-tool", "POST", "/tools/nothing/orders", {}, ORDER, 403, "unknown_route"),
    (
        "no-idempotency-key",
        "POST",
        "/tools/supplier/orders",
        {"Idempotency-Key": None},
        ORDER,
        400,
        "idempotency_key_required",
    ),
    (
        "bad-idempotency-key",
        "POST",
        "/tools/supplier/orders",
        {"Idempotency-Key": "a b"},
        ORDER,
        400,
        "bad_idempotency_key",
    ),
    ("bad-json", "POST", "/tools/supplier/orders", {}, b'{"quantity": 1,', 400, "bad_json"),
    ("nan", "POST", "/tools/supplier/orders", {}, ORDER.replace(b'"100"', b"NaN"), 400, "bad_json"),
    (
        "infinity",
        "POST",
        "/tools/supplier/orders",
        {},
        ORDER.replace(b"10", b"Infinity", 1),
        400,
        "bad_json",
    ),
    (
        "duplicate-keys",
        "POST",
        "/tools/supplier/orders",
        {},
        ORDER[:-1] + b', "quantity": 1}',
        400,
        "bad_json",
    ),
    (
        "huge-exponent",
        "POST",
        "/tools/supplier/orders",
        {},
        ORDER.replace(b"10", b"1e999999", 1),
        422,
        "bad_amount",
    ),
    # ledger/limits.py's amount bound: priced (then capped), one more is refused.
    (
        "face-at-ledger-bound",
        "POST",
        "/tools/supplier/orders",
        {},
        order_of(MAX_AMOUNT),
        403,
        "per_effect_cap",
    ),
    (
        "face-above-ledger-bound",
        "POST",
        "/tools/supplier/orders",
        {},
        order_of(MAX_AMOUNT + 1),
        422,
        "bad_amount",
    ),
    ("too-deep", "POST", "/tools/supplier/orders", {}, deep(40), 400, "bad_json"),
    ("not-utf8", "POST", "/tools/supplier/orders", {}, b'{"sku": "\xff"}', 400, "bad_json"),
    # An unpaired surrogate is no Unicode text: an upstream reads it as U+FFFD, as
    # itself, or fails (Go, JavaScript, Rust), and UTF-8 cannot carry it on.
    (
        "lone-surrogate",
        "POST",
        "/tools/supplier/orders",
        {},
        ORDER.replace(b'"bolts"', b'"bolts\\ud800"'),
        400,
        "bad_json",
    ),
    (
        "lone-surrogate-key",
        "POST",
        "/tools/supplier/orders",
        {},
        ORDER.replace(b'"sku"', b'"sku\\udc00"'),
        400,
        "bad_json",
    ),
    (
        "not-json",
        "POST",
        "/tools/supplier/orders",
        {"Content-Type": "text/plain"},
        ORDER,
        415,
        "unsupported_media_type",
    ),
    (
        "too-large",
        "POST",
        "/tools/supplier/orders",
        {},
        b" " * (MAX_BODY_BYTES + 1),
        413,
        "body_too_large",
    ),
    (
        "per-effect-cap",
        "POST",
        "/tools/supplier/orders",
        {},
        json.dumps(order(quantity=501)).encode(),
        403,
        "per_effect_cap",
    ),
    ("in-process-route", "POST", "/tools/deploy/deploys", {}, b"{}", 403, "in_process_route"),
    (
        "no-token",
        "POST",
        "/tools/supplier/orders",
        {"Authorization": None},
        ORDER,
        401,
        "unauthenticated",
    ),
    (
        "wrong-token",
        "POST",
        "/tools/supplier/orders",
        {"Authorization": "Bearer irrev_nope"},
        ORDER,
        401,
        "unauthenticated",
    ),
    (
        "not-bearer",
        "POST",
        "/tools/supplier/orders",
        {"Authorization": "Basic Zm9vOmJhcg=="},
        ORDER,
        401,
        "unauthenticated",
    ),
    ("unknown-api-route", "GET", "/v2/anything", {}, b"", 404, "not_found"),
    ("wrong-method", "DELETE", "/v1/holds", {}, b"", 405, "method_not_allowed"),
    ("holds-bad-json", "POST", "/v1/holds", {}, b"{", 400, "bad_json"),
    (
        "holds-extra-field",
        "POST",
        "/v1/holds",
        {},
        b'{"tool":"deploy","method":"POST","path":"/deploys","price":0}',
        422,
        "bad_request",
    ),
    (
        "holds-string-amount",
        "POST",
        "/v1/holds/abc/post",
        {},
        b'{"amount_micros":"5"}',
        422,
        "bad_request",
    ),
    (
        "holds-negative",
        "POST",
        "/v1/holds/abc/compensate",
        {},
        b'{"recovered_micros":-1}',
        422,
        "bad_request",
    ),
    (
        "holds-at-ledger-bound",
        "POST",
        "/v1/holds/abc/post",
        {},
        json.dumps({"amount_micros": MAX_AMOUNT}).encode(),
        404,
        "not_found",
    ),
    (
        "holds-above-ledger-bound",
        "POST",
        "/v1/holds/abc/post",
        {},
        json.dumps({"amount_micros": MAX_AMOUNT + 1}).encode(),
        422,
        "bad_request",
    ),
    (
        "holds-huge",
        "POST",
        "/v1/holds/abc/compensate",
        {},
        b'{"recovered_micros":1e400}',
        422,
        "bad_request",
    ),
    ("hold-unknown", "GET", "/v1/holds/abc", {}, b"", 404, "not_found"),
    ("hold-bad-id", "GET", "/v1/holds/" + "x" * 300, {}, b"", 422, "bad_input"),
    ("escalation-bad-id", "GET", "/v1/escalations/nodot", {}, b"", 404, "not_found"),
    ("escalation-unknown-tenant", "GET", "/v1/escalations/nobody.abc", {}, b"", 404, "not_found"),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "reason"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
async def test_bad_input_is_a_problem_and_debits_nothing(
    bad_input_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    method: str,
    path: str,
    headers: dict[str, str | None],
    body: bytes,
    status: int,
    reason: str,
) -> None:
    tenant = bad_input_tenant
    before = await balances(http, gateway.admin, tenant)
    # A header given as None is left out.
    sent: dict[str, str | None] = {
        **effect_headers(tenant, "buyer-01", f"bad-{reason}"),
        "Content-Type": "application/json",
        **headers,
    }
    response = await http.request(
        method, path, content=body, headers={k: v for k, v in sent.items() if v is not None}
    )
    assert_problem(response, status, reason)
    assert await balances(http, gateway.admin, tenant) == before
    assert (await supplier_stats(upstream, tenant))["requests"] == 0


async def test_chunked_oversized_body_is_refused(
    bad_input_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = bad_input_tenant

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b" " * 4096

    response = await http.post(
        "/tools/supplier/orders",
        content=chunks(),
        headers={
            **effect_headers(tenant, "buyer-01", "chunked"),
            "Content-Type": "application/json",
        },
    )
    assert_problem(response, 413, "body_too_large")


async def test_a_body_field_the_route_does_not_list_is_refused(
    bad_input_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """POST /orders lists its body fields: an unlisted one was forwarded unpriced."""
    tenant = bad_input_tenant
    before = await balances(http, gateway.admin, tenant)
    requests = (await supplier_stats(upstream, tenant))["requests"]
    response = await http.post(
        "/tools/supplier/orders",
        json={**order(), "express": True},
        headers=effect_headers(tenant, "buyer-01", "unlisted"),
    )
    body = assert_problem(response, 422, "undeclared_field")
    assert body["field"] == "express"
    assert await balances(http, gateway.admin, tenant) == before
    assert (await supplier_stats(upstream, tenant))["requests"] == requests


async def test_a_trickled_body_is_cut_off_and_debits_nothing(
    bad_input_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """A slow loris: the body comes a byte at a time, far slower than
    IRREV_BODY_TIMEOUT_S allows. Before, it held the worker for as long as it liked."""
    tenant = bad_input_tenant
    before = await balances(http, gateway.admin, tenant)
    headers = {**effect_headers(tenant, "buyer-01", "loris"), "Content-Type": "application/json"}
    body = json.dumps(order()).encode()
    status, problem = await trickled_request(gateway.url, "/tools/supplier/orders", headers, body)
    assert (status, problem["reason"]) == (408, "body_timeout")
    assert await balances(http, gateway.admin, tenant) == before


async def test_budget_denial_names_the_numbers(
    basics_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """buyer-41 acts for facilities (limit 60000 USD): 20000 USD orders soon hit it."""
    tenant = basics_tenant
    for attempt in range(6):
        response = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=200, unit_price="100", supplier_id="s-deny"),
            headers=effect_headers(tenant, "buyer-41", f"deny-{attempt}"),
        )
        if response.status_code == 403:
            break
        assert response.status_code in (201, 202), response.text
    body = assert_problem(response, 403, "budget_exceeded")
    assert body["account"] == "principal:facilities"
    assert body["limit"] == 60_000 * 10**6
    assert 0 <= body["available"] < body["price"]
    rows = await balances(http, gateway.admin, tenant)
    assert (
        rows["principal:facilities"]["pending"] + rows["principal:facilities"]["posted"]
        <= body["limit"]
    )


# A path parameter that is a dot segment, or that decodes to '?', '#' or '%', must not
# turn the priced route into another request upstream: a cancellation priced at its
# small fee must never reach the supplier as `POST /orders/` (a new order).
TRICKY_ORDER_IDS = [
    ("dot-dot", "..", ".."),
    ("encoded-dot-dot", "%2e%2e", ".."),
    ("dot", ".", "."),
    ("question-mark", "%3F", "?"),
    ("hash", "%23", "#"),
    ("percent", "%25", "%"),
    ("space", "a%20b", "a b"),
]


@pytest.mark.parametrize(
    ("sent", "decoded"),
    [case[1:] for case in TRICKY_ORDER_IDS],
    ids=[case[0] for case in TRICKY_ORDER_IDS],
)
async def test_what_is_priced_is_what_is_forwarded(
    paths_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    sent: str,
    decoded: str,
) -> None:
    tenant = paths_tenant
    body = json.dumps({"supplier_id": "s1", "cancellation_fee": "5"}).encode()
    seen_before = (await upstream.get(f"/_seen/{tenant.id}")).json()
    status, headers, content = await raw_request(
        gateway.url,
        "POST",
        f"/tools/supplier/orders/{sent}/cancel",
        {
            **effect_headers(tenant, "buyer-01", f"cancel-{sent}"),
            "Content-Type": "application/json",
        },
        body,
    )
    assert status < 500 or status == 502, content
    forwarded = (await upstream.get(f"/_seen/{tenant.id}")).json()[len(seen_before) :]
    if decoded in (".", ".."):
        # Refused: a client or server would resolve it to another path.
        assert (status, json.loads(content)["reason"]) == (422, "bad_request")
        assert headers["content-type"] == "application/problem+json"
        assert forwarded == []
        assert used(await balances(http, gateway.admin, tenant)) == {}
        return
    # Forwarded to exactly the priced path, the parameter percent-encoded.
    assert forwarded == [["POST", f"/{tenant.id}/orders/{quote(decoded, safe='')}/cancel"]]


async def test_one_key_on_two_unknown_routes_is_two_effects(
    unknown_routes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """The route id, which names a hold with the agent's key, is derived in one place:
    a listed route's template or, for an unknown route, its very path. So one key sent
    to two unknown paths holds two effects, and a repeat on one path is that one."""
    tenant = unknown_routes_tenant
    headers = effect_headers(tenant, "picker-1", "one-key")
    holds = []
    for path in ("/adjustments", "/recounts", "/adjustments"):
        # Above globex's 500 EUR approval threshold: held, escalated, never forwarded.
        response = await http.post(
            f"/tools/inventory{path}", json={"amount": "600"}, headers=headers
        )
        assert response.status_code == 202, response.text
        holds.append(response.headers["x-irrev-hold"])
    assert holds[0] != holds[1] and holds[2] == holds[0]
    queue = await http.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gateway.admin)
    assert queue.status_code == 200, queue.text
    assert sorted(e["route"] for e in queue.json()["escalations"]) == [
        "inventory POST /adjustments",
        "inventory POST /recounts",
    ]


async def test_an_effect_with_no_upstream_is_refused_before_anything_is_held(
    unknown_no_upstream_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """An unknown route of a tool without an upstream (an in-process tool) was held,
    then refused `no_upstream`, leaving a hold that turned ambiguous and stayed
    charged for an effect that was never sent. It is refused before the reserve."""
    tenant = unknown_no_upstream_tenant
    before = used(await balances(http, gateway.admin, tenant))
    response = await http.post(
        "/tools/deploy/rollbacks",
        json={"amount": "5"},
        headers=effect_headers(tenant, "deployer-01", "no-upstream"),
    )
    assert_problem(response, 403, "no_upstream")
    assert used(await balances(http, gateway.admin, tenant)) == before
    for state in ("pending", "ambiguous"):
        assert await holds_in(http, gateway.admin, tenant, state) == {}
