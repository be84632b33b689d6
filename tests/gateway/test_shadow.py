"""Shadow mode through a real gateway: a would-be denial or escalation is held,
forwarded and charged, and recorded (header, journal, log line, metrics); a route's
own `mode` leaves the tenant's other routes enforced. Money in headers and JSON
carries its currency."""

from __future__ import annotations

import httpx
import pytest

from .conftest import Gateway, TenantMaker
from .helpers import (
    DEPLOY,
    assert_problem,
    balances,
    effect_headers,
    holds_in,
    ledger_audit,
    order,
    supplier_stats,
)
from .procurement import example_accounts, order_routes
from .servers import Tenant


# Shadow mode for the whole tenant, on a 2000 USD budget.
@pytest.fixture(scope="module")
def shadow_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("shadow", mode="shadow", accounts=example_accounts(tenant={"limit": "2000"}))


@pytest.fixture(scope="module")
def shadow_route_tenant(new_tenant: TenantMaker) -> Tenant:
    """A tenant budget of 1 USD, and supplier orders (only) in shadow mode: every
    order is a would-be denial, forwarded anyway; refunds are enforced."""
    return new_tenant(
        "shadow-route",
        routes=order_routes(mode="shadow"),
        accounts=example_accounts(tenant={"limit": "1"}),
    )


@pytest.fixture(scope="module")
def basics_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("basics")


# An enforced tenant whose supplier orders alone are in shadow mode (issue 26).
@pytest.fixture(scope="module")
def shadow_isolation_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("shadow-isolation", routes=order_routes(mode="shadow"))


async def test_would_be_denials_are_forwarded_charged_and_recorded(
    shadow_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = shadow_tenant
    shadow: dict[str, str] = {}
    holds = []
    # 1000 USD orders on a 2000 USD tenant budget, then one above the agent's 50,000
    # USD per-effect cap: enforcement admits, escalates (soft band), denies.
    orders = [order(quantity=10, unit_price="100") for _ in range(4)]
    orders.append(order(quantity=1, unit_price="60000"))
    for i, body in enumerate(orders):
        response = await http.post(
            "/tools/supplier/orders", json=body, headers=effect_headers(tenant, "buyer-01", f"s{i}")
        )
        assert response.status_code == 201, response.text
        assert response.headers["x-irrev-decision"] == "admit"
        holds.append(response.headers["x-irrev-hold"])
        if "x-irrev-shadow-decision" in response.headers:
            assert response.headers["x-irrev-mode"] == "shadow"
            shadow[holds[-1]] = response.headers["x-irrev-shadow-decision"]
    assert holds[0] not in shadow  # within budget: enforcement admits it too
    assert "deny" in shadow.values()
    assert shadow[holds[-1]] == "deny"  # the per-effect cap
    # Every order reached the supplier and was posted: the shadow twin of the tenant's
    # budget shows the exposure; the enforced budget is untouched by it.
    assert (await supplier_stats(upstream, tenant))["orders"] == len(orders)
    assert set(holds) <= set(await holds_in(http, gateway.admin, tenant, "posted"))
    rows = await balances(http, gateway.admin, tenant)
    top = rows[f"shadow:tenant:{tenant.id}"]
    assert top["pending"] + top["posted"] > top["limit"] == rows[f"tenant:{tenant.id}"]["limit"]
    assert rows[f"tenant:{tenant.id}"]["pending"] + rows[f"tenant:{tenant.id}"]["posted"] == 0

    url = f"/v1/admin/tenants/{tenant.id}/journal"
    journal = await http.get(url, params={"count": 1000}, headers=gateway.admin)
    entries = journal.json()["entries"]
    marked = {e["hold"]: e["shadow"] for e in entries if e["op"] == "reserve" and "shadow" in e}
    # (The per-effect cap is checked before the ledger; the tenant, over its limit by
    # then, is a would-be denial there too.)
    assert marked == shadow
    logged = {
        e["hold_id"]: (e["decision"], e["reason"])
        for e in gateway.log_entries()
        if e.get("msg") == "shadow decision" and e.get("tenant") == tenant.id
    }
    assert logged[holds[-1]] == ("deny", "per_effect_cap")
    assert {h: d for h, (d, _) in logged.items()} == shadow
    metrics = (await http.get("/metrics", headers=gateway.admin)).text
    assert (
        'irrev_decisions_total{decision="deny",mode="shadow",reason="per_effect_cap",'
        f'tenant="{tenant.id}"}} 1.0' in metrics
    )
    # The audit replays the journal: balances match, and shadow holds are exempt
    # from contract 1 (the only holds above a limit).
    audit = ledger_audit(gateway.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_a_shadow_route_leaves_the_others_enforced(
    shadow_route_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = shadow_route_tenant
    shadowed = await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-02", "o1")
    )
    assert shadowed.status_code == 201, shadowed.text
    assert shadowed.headers["x-irrev-shadow-decision"] == "deny"
    assert shadowed.headers["x-irrev-currency"] == "USD"
    assert int(shadowed.headers["x-irrev-remaining"]) < 0
    refund = {"customer_id": "c1", "amount": "10"}
    refused = await http.post(
        "/tools/payments/refunds", json=refund, headers=effect_headers(tenant, "refunds-01", "r1")
    )
    body = assert_problem(refused, 403, "budget_exceeded")
    assert body["currency"] == "USD" and body["limit_text"] == "1 USD"
    assert body["price_text"].endswith(" USD") and isinstance(body["price"], int)


async def test_budget_headers_carry_the_unit(
    basics_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = basics_tenant
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=1, unit_price="10"),
        headers=effect_headers(tenant, "buyer-04", "units-1"),
    )
    assert response.status_code == 201, response.text
    headers = response.headers
    assert (headers["x-irrev-currency"], headers["x-irrev-scale"]) == ("USD", "1000000")
    price = int(headers["x-irrev-price"])
    major, currency = headers["x-irrev-price-text"].split(" ")
    assert currency == "USD" and round(float(major) * 10**6) == price
    assert "," not in headers["x-irrev-remaining-text"]
    assert "x-irrev-shadow-decision" not in headers
    held = (await holds_in(http, gateway.admin, tenant, "posted"))[headers["x-irrev-hold"]]
    assert held["currency"] == "USD"
    assert held["posted_text"][f"tenant:{tenant.id}"] == f"{major} USD"
    assert held["deadline_at"].endswith("Z")


async def test_the_decision_api_holds_a_would_be_denial_in_shadow_mode(
    shadow_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Three 1000 USD deploys on a 2000 USD tenant budget: whatever ran before, the
    last is a would-be denial, held pending for the in-process tool to act on."""
    tenant = shadow_tenant
    deploy = {"tool": "deploy", "method": "POST", "path": "/deploys"}
    created = [
        await http.post(
            "/v1/holds", json=deploy, headers=effect_headers(tenant, "deployer-01", f"d{i}")
        )
        for i in range(3)
    ]
    assert [r.status_code for r in created] == [201, 201, 201], created[-1].text
    last = created[-1]
    assert last.headers["x-irrev-shadow-decision"] == "deny"
    assert last.headers["x-irrev-shadow-reason"] in ("budget_exceeded", "over_limit")
    view = last.json()
    assert (view["state"], view["decision"]) == ("pending", "deny")
    assert view["remaining"] < 0 and view["remaining_text"].startswith("-")
    assert view["currency"] == "USD" and view["deadline_at"].endswith("Z")


async def test_a_shadow_effect_above_every_cap_leaves_enforced_routes_admitted(
    shadow_isolation_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Issue 26: one 400,000 USD order on a shadow route, above the agent's cap and the
    tenant's whole 250,000 USD budget, was charged to the accounts enforced routes
    share, which went below zero: every enforced effect was then refused until the
    window renewed. Shadow holds now live on the accounts' shadow twins."""
    tenant = shadow_isolation_tenant
    huge = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=4000, unit_price="100"),
        headers=effect_headers(tenant, "buyer-01", "huge"),
    )
    assert huge.status_code == 201, huge.text
    assert huge.headers["x-irrev-shadow-decision"] == "deny"
    # Deploys (1,000 USD each, enforced) on the same tenant budget: admitted.
    for i in range(3):
        deploy = await http.post(
            "/v1/holds", json=DEPLOY, headers=effect_headers(tenant, "deployer-01", f"d{i}")
        )
        assert deploy.status_code == 201, deploy.text
        assert deploy.headers["x-irrev-decision"] == "admit"
        assert "x-irrev-shadow-decision" not in deploy.headers
    rows = await balances(http, gateway.admin, tenant)
    enforced, shadow = rows[f"tenant:{tenant.id}"], rows[f"shadow:tenant:{tenant.id}"]
    assert enforced["pending"] + enforced["posted"] == 3 * 1_000 * 10**6  # the deploys
    assert shadow["pending"] + shadow["posted"] > shadow["limit"]
    buyer = rows["agent:buyer-01"]
    assert buyer["pending"] + buyer["posted"] == 0
    audit = ledger_audit(gateway.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr
