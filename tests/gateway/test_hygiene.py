"""What an agent cannot do to the gateway's availability and what it cannot learn from
it: new risk factors are admitted whatever their number, refused or free requests
leave nothing in Redis beyond a small, short-lived record, a policy that could never
forward is refused, and the unauthenticated endpoints name no tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import yaml

from ledger.cluster import RedisClient
from ledger.cluster import redis_client as open_redis
from ledger.keys import accounts_key, hold_key, payload_key
from ledger.replies import decoded

from .conftest import Gateway, TenantMaker, policy_dir_of
from .helpers import (
    assert_problem,
    balances,
    based,
    effect_headers,
    holds_in,
    order,
    raw_request,
    scrape_fleet,
    set_faults,
    supplier_stats,
)
from .procurement import example_accounts, order_routes
from .servers import Tenant


@pytest.fixture(scope="module")
def two_factors_tenant(new_tenant: TenantMaker) -> Tenant:
    """procurement, with orders capped per supplier and per SKU: two factor accounts
    that a first order to a new supplier of a new SKU meets together."""
    routes = order_routes(risk_factors=["supplier:{supplier_id}", "sku:{sku}"])
    accounts = example_accounts()
    accounts["risk_factors"]["sku:*"] = {"limit": "100000"}
    return new_tenant("two-factors", routes=routes, accounts=accounts)


# A tenant budget of 1 USD: every order but a free one is refused.
@pytest.fixture(scope="module")
def tight_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("tight", accounts=example_accounts(tenant={"limit": "1"}))


@pytest.fixture(scope="module")
def hygiene_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("hygiene")


# IRREV_DENIED_RETENTION_S's default: a refusal is replayed for minutes, not days.
DENIED_RETENTION_MS = 600_000


@pytest.fixture
async def redis_client(gateway: Gateway) -> AsyncIterator[RedisClient]:
    client = open_redis(gateway.redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def accounts_named(client: RedisClient, tenant: Tenant, start: str) -> list[str]:
    fields: list[str] = await decoded(client.hkeys(accounts_key(tenant.id)))
    return sorted({f.rpartition("|")[0] for f in fields if f.startswith(start)})


async def test_an_order_meeting_two_new_risk_factors_is_admitted(
    two_factors_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Observation 9: a new supplier of a new SKU opens both factor accounts at once."""
    tenant = two_factors_tenant
    response = await http.post(
        "/tools/supplier/orders",
        json=order(supplier_id="new-payee", sku="new-sku"),
        headers=effect_headers(tenant, "buyer-01", "two-new"),
    )
    assert response.status_code == 201, response.text
    price = int(response.headers["x-irrev-price"])
    rows = await balances(http, gateway.admin, tenant)
    for account in ("factor:supplier:new-payee", "factor:sku:new-sku"):
        assert rows[account]["posted"] == price, account
        assert rows[account]["limit"] == 100_000 * 10**6, account


async def test_free_and_refused_requests_open_no_accounts(
    tight_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, redis_client: RedisClient
) -> None:
    """Observation 10: neither a zero-priced nor a denied request creates an account;
    a denied one keeps no request and lives minutes, not days."""
    tenant = tight_tenant
    for i in range(20):
        free = await http.post(
            "/tools/supplier/orders",
            json=order(unit_price="0", supplier_id=f"free-{i}"),
            headers=effect_headers(tenant, "buyer-01", f"free-{i}"),
        )
        assert free.status_code == 201, free.text
        assert free.headers["x-irrev-price"] == "0"
    refused = []
    for i in range(5):
        response = await http.post(
            "/tools/supplier/orders",
            json=order(supplier_id=f"refused-{i}"),
            headers=effect_headers(tenant, "buyer-02", f"refused-{i}"),
        )
        refused.append(assert_problem(response, 403, "budget_exceeded")["hold"])
    assert await accounts_named(redis_client, tenant, "factor:supplier:free-") == []
    assert await accounts_named(redis_client, tenant, "factor:supplier:refused-") == []
    for hold in refused:
        key = hold_key(tenant.id, hold)
        assert await redis_client.hget(key, "st") == "denied"
        assert not await redis_client.exists(payload_key(tenant.id, hold))
        assert 0 < await redis_client.pttl(key) <= DENIED_RETENTION_MS
    # A retry of a refused key within that time gets the same refusal.
    again = await http.post(
        "/tools/supplier/orders",
        json=order(supplier_id="refused-0"),
        headers=effect_headers(tenant, "buyer-02", "refused-0"),
    )
    assert assert_problem(again, 403, "budget_exceeded")["hold"] == refused[0]


async def test_a_voided_key_is_replayed_as_a_problem_not_an_empty_200(
    hygiene_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """Observation 14: the receipt a void leaves is not the effect's answer."""
    tenant = hygiene_tenant
    await set_faults(upstream, tenant, status=503, apply=False, times=1)
    headers = effect_headers(tenant, "buyer-01", "voided")
    first = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert_problem(first, 502, "upstream_ambiguous")
    hold = first.headers["x-irrev-hold"]
    # The supplier says it never made the order: its settler voids the hold.
    voided = await http.post(f"/v1/holds/{hold}/void", headers=tenant.settler("supplier"))
    assert voided.status_code == 200, voided.text
    orders = (await supplier_stats(upstream, tenant))["orders"]
    again = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    body = assert_problem(again, 409, "hold_voided")
    assert body["hold"] == hold
    assert (await supplier_stats(upstream, tenant))["orders"] == orders


async def test_two_authorization_headers_are_refused(
    hygiene_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Observation 14: which of two credentials is the caller is not the gateway's guess."""
    tenant = hygiene_tenant
    body = b'{"supplier_id": "s1", "sku": "bolts", "quantity": 1, "unit_price": "1"}'
    for first, second in (
        (tenant.auth("buyer-01"), tenant.auth("buyer-02")),
        (gateway.admin, {"Authorization": "Bearer nobody"}),
    ):
        headers = {
            "Authorization": first["Authorization"],
            "authorization": second["Authorization"],
            "Idempotency-Key": "two-auth",
            "Content-Type": "application/json",
        }
        status, got, text = await raw_request(
            gateway.url, "POST", "/tools/supplier/orders", headers, body
        )
        assert status == 400, text
        assert got["content-type"] == "application/problem+json"
        assert b'"reason":"bad_authorization"' in text
    assert "two-auth" not in str(await holds_in(http, gateway.admin, tenant, "posted"))


async def test_health_endpoints_name_no_tenant_to_strangers(
    hygiene_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Observation 14: /readyz says ready; /metrics has tenant labels for admins only."""
    tenant = hygiene_tenant
    await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-03", "m")
    )
    ready = await http.get("/readyz")
    assert ready.json() == {"status": "ready"}
    anonymous = await scrape_fleet(http, {}, 'irrev_live_holds{state="pending"}')
    assert tenant.id not in anonymous and "tenant=" not in anonymous
    assert (
        'irrev_decisions_total{decision="admit",mode="enforce",reason="within_budget"}' in anonymous
    )
    assert 'irrev_live_holds{state="pending"}' in anonymous
    as_admin = (await http.get("/metrics", headers=gateway.admin)).text
    assert f'tenant="{tenant.id}"' in as_admin


async def test_a_policy_whose_hold_ttl_cannot_outlive_a_forward_is_refused(
    hygiene_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Observation 12: with a 3 s upstream timeout and a 0.5 s margin (the test
    gateway's settings), a 4 s hold TTL would refuse every effect 503 hold_deadline."""
    tenant = hygiene_tenant
    path = policy_dir_of(gateway) / f"{tenant.id}.yaml"
    written = path.read_text()
    policy = yaml.safe_load(written)
    policy["hold_ttl"] = "4s"
    response = await http.put(
        f"/v1/admin/tenants/{tenant.id}/policy",
        content=yaml.safe_dump(policy, sort_keys=False),
        headers=await based(http, tenant.id, gateway.admin),
    )
    body = assert_problem(response, 422, "invalid_policy")
    said = " ".join(body["problems"])
    assert "hold_ttl" in said and "4.5 s" in said, body
    assert path.read_text() == written
    effect = await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-04", "ttl")
    )
    assert effect.status_code == 201, effect.text
