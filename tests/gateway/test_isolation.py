"""Tenant isolation and admin authentication: an agent of one tenant can neither read
nor debit another's routes, holds or escalations; admin routes need an admin token."""

from __future__ import annotations

import httpx
import pytest

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem, balances, effect_headers, order, used
from .servers import Tenant


@pytest.fixture(scope="module")
def iso_acme_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("iso-acme")


@pytest.fixture(scope="module")
def iso_globex_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("iso-globex", "globex")


async def escalated_globex_hold(http: httpx.AsyncClient, globex: Tenant) -> tuple[str, str]:
    """A live globex hold: an unknown route priced at face value above its 500 EUR
    approval threshold escalates and holds budget. (hold id, escalation URL)"""
    response = await http.post(
        "/tools/inventory/adjustments",
        json={"amount": "600"},
        headers=effect_headers(globex, "picker-1", "adjust-1"),
    )
    assert response.status_code == 202, response.text
    return response.headers["x-irrev-hold"], response.headers["location"]


async def test_an_agent_cannot_use_another_tenants_routes(
    iso_acme_tenant: Tenant,
    iso_globex_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    acme, globex = iso_acme_tenant, iso_globex_tenant
    before = [used(await balances(http, gateway.admin, t)) for t in (acme, globex)]
    writeoff = await http.post(
        "/tools/inventory/stock/bolts/writeoff",
        json={"units": 1, "unit_cost": "10"},
        headers=effect_headers(acme, "buyer-01", "cross-1"),
    )
    assert_problem(writeoff, 403, "unknown_route")
    stock = await http.get("/tools/inventory/stock/bolts", headers=acme.auth("buyer-01"))
    assert_problem(stock, 403, "unknown_route")
    # globex prices unknown routes of its own tools; acme's supplier is not one of them.
    order_ = await http.post(
        "/tools/supplier/orders",
        json={**order(), "amount": "1"},
        headers=effect_headers(globex, "picker-1", "cross-2"),
    )
    assert_problem(order_, 403, "unknown_route")
    assert [used(await balances(http, gateway.admin, t)) for t in (acme, globex)] == before
    for tenant in (acme, globex):
        assert (await upstream.get(f"/_seen/{tenant.id}")).json() == []


async def test_an_agent_cannot_see_or_settle_another_tenants_holds(
    iso_acme_tenant: Tenant, iso_globex_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    acme, globex = iso_acme_tenant, iso_globex_tenant
    hold, location = await escalated_globex_hold(http, globex)
    globex_used = used(await balances(http, gateway.admin, globex))
    acme_used = used(await balances(http, gateway.admin, acme))
    intruder = acme.auth("buyer-01")

    assert_problem(await http.get(f"/v1/holds/{hold}", headers=intruder), 404, "not_found")
    for action, body in [
        ("post", {}),
        ("void", None),
        ("ambiguous", {}),
        ("compensate", {"recovered_micros": 1}),
    ]:
        response = await http.post(f"/v1/holds/{hold}/{action}", json=body, headers=intruder)
        assert_problem(response, 404, "not_found")
    assert_problem(await http.get(location, headers=intruder), 404, "not_found")
    for action in ("approve", "reject"):
        response = await http.post(f"{location}/{action}", headers=intruder)
        assert_problem(response, 401, "unauthenticated")
    # Not even another agent of the same tenant sees it.
    assert_problem(await http.get(location, headers=globex.auth("picker-2")), 404, "not_found")
    assert_problem(
        await http.get(f"/v1/holds/{hold}", headers=globex.auth("picker-2")), 404, "not_found"
    )

    mine = await http.get(location, headers=globex.auth("picker-1"))
    assert mine.status_code == 202 and mine.json()["status"] == "escalated"
    assert used(await balances(http, gateway.admin, globex)) == globex_used
    assert used(await balances(http, gateway.admin, acme)) == acme_used


async def test_an_acme_hold_is_not_found_through_a_globex_token(
    iso_acme_tenant: Tenant, iso_globex_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    acme, globex = iso_acme_tenant, iso_globex_tenant
    created = await http.post(
        "/v1/holds",
        json={"tool": "deploy", "method": "POST", "path": "/deploys"},
        headers=effect_headers(acme, "deployer-01", "iso-deploy"),
    )
    assert created.status_code == 201, created.text
    hold = created.json()["hold"]
    void = await http.post(f"/v1/holds/{hold}/void", headers=globex.auth("picker-1"))
    assert_problem(void, 404, "not_found")
    mine = await http.get(f"/v1/holds/{hold}", headers=acme.auth("deployer-01"))
    assert mine.json()["state"] == "pending"


ADMIN_ROUTES = [
    ("GET", "/v1/admin/tenants"),
    ("GET", "/v1/admin/tenants/{t}/policy"),
    ("PUT", "/v1/admin/tenants/{t}/policy"),
    ("POST", "/v1/admin/policies/reload"),
    ("GET", "/v1/admin/tenants/{t}/balances"),
    ("GET", "/v1/admin/tenants/{t}/journal"),
    ("GET", "/v1/admin/tenants/{t}/holds?state=pending"),
    ("GET", "/v1/admin/tenants/{t}/escalations"),
    ("POST", "/v1/admin/tenants/{t}/reconcile"),
    ("POST", "/v1/escalations/{t}.0123456789abcdef/approve"),
    ("POST", "/v1/escalations/{t}.0123456789abcdef/reject"),
]


@pytest.mark.parametrize(
    ("method", "route"), ADMIN_ROUTES, ids=[f"{m} {r}" for m, r in ADMIN_ROUTES]
)
async def test_admin_routes_need_an_admin_token(
    iso_acme_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, method: str, route: str
) -> None:
    acme = iso_acme_tenant
    path = route.format(t=acme.id)
    wrong = [
        {},
        {"Authorization": "Bearer not-an-admin-token-at-all"},
        {"Authorization": f"Basic {gateway.admin_token}"},
        {"Authorization": f"Bearer {gateway.admin_token}x"},
        acme.auth("buyer-01"),
    ]
    for headers in wrong:
        response = await http.request(method, path, headers=headers, content=b"tenant: x")
        body = assert_problem(response, 401, "unauthenticated")
        assert "admin" in body["detail"]
        assert response.headers["www-authenticate"] == "Bearer"
    response = await http.request(method, path, headers=gateway.admin, content=b"tenant: x")
    assert response.status_code != 401


async def test_admin_routes_of_an_unknown_tenant_are_404(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    for path in ("balances", "journal", "escalations", "policy"):
        response = await http.get(f"/v1/admin/tenants/nobody/{path}", headers=gateway.admin)
        assert_problem(response, 404, "unknown_tenant")
    approve = await http.post("/v1/escalations/nobody.abc/approve", headers=gateway.admin)
    assert_problem(approve, 404, "not_found")
