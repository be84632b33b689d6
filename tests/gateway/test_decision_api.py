"""The decision-only API for in-process tools (the `deploy` route): create a hold, then
post, compensate, void or mark it ambiguous, with the ledger's semantics."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem, balances, effect_headers, order, used
from .procurement import LEARNING_ROUTES, PROCUREMENT, example_accounts
from .servers import Tenant


@pytest.fixture(scope="module")
def decision_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("decision")


@pytest.fixture(scope="module")
def overrun_tenant(new_tenant: TenantMaker) -> Tenant:
    """Deploys compensable, their p_fail learned and agents' overrun reports allowed
    (procurement.LEARNED_DEPLOY), on a 500 USD platform budget."""
    principals = {**PROCUREMENT["accounts"]["principals"], "platform": {"limit": "500"}}
    return new_tenant(
        "overrun", routes=LEARNING_ROUTES, accounts=example_accounts(principals=principals)
    )


@pytest.fixture(scope="module")
def decision_budget_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("decision-budget")


DEPLOY = {"tool": "deploy", "method": "POST", "path": "/deploys"}
PRICE = 1000 * 10**6  # irreversible at its fixed face value, 1000 USD


async def create(http: httpx.AsyncClient, tenant: Tenant, key: str) -> httpx.Response:
    return await http.post(
        "/v1/holds", json=DEPLOY, headers=effect_headers(tenant, "deployer-01", key)
    )


def platform_used(rows: dict[str, int]) -> int:
    return rows.get("principal:platform", 0)


async def test_create_post_compensate_round_trip(
    decision_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = decision_tenant
    me = tenant.auth("deployer-01")
    before = platform_used(used(await balances(http, gateway.admin, tenant)))

    created = await create(http, tenant, "deploy-1")
    assert created.status_code == 201, created.text
    view = created.json()
    hold = view["hold"]
    assert (view["state"], view["decision"], view["price"]) == ("pending", "admit", PRICE)
    assert created.headers["x-irrev-hold"] == hold
    assert created.headers["x-irrev-decision"] == "admit"
    assert set(view["amounts"]) == {
        f"tenant:{tenant.id}",
        "principal:platform",
        "agent:deployer-01",
    }
    rows = used(await balances(http, gateway.admin, tenant))
    assert platform_used(rows) == before + PRICE

    again = await create(http, tenant, "deploy-1")
    assert again.status_code == 200
    assert again.json()["hold"] == hold
    assert again.headers["x-irrev-replayed"] == "true"
    assert used(await balances(http, gateway.admin, tenant)) == rows

    posted = await http.post(f"/v1/holds/{hold}/post", json={}, headers=me)
    assert posted.status_code == 200, posted.text
    assert posted.json()["state"] == "posted"
    assert (await http.get(f"/v1/holds/{hold}", headers=me)).json()["posted"] == view["amounts"]
    assert platform_used(used(await balances(http, gateway.admin, tenant))) == before + PRICE

    # An irreversible deploy is not its agent's to compensate; the tool's settler
    # credential reports what was recovered.
    recovered = 600 * 10**6
    compensated = await http.post(
        f"/v1/holds/{hold}/compensate",
        json={"recovered_micros": recovered},
        headers=tenant.settler("deploy"),
    )
    assert compensated.status_code == 200, compensated.text
    assert compensated.json()["state"] == "posted"
    view = (await http.get(f"/v1/holds/{hold}", headers=me)).json()
    assert view["compensated"] == dict.fromkeys(view["amounts"], recovered)
    assert platform_used(used(await balances(http, gateway.admin, tenant))) == (
        before + PRICE - recovered
    )
    # Settled holds stay settled.
    assert_problem(await http.post(f"/v1/holds/{hold}/void", headers=me), 409, "state_conflict")


async def test_overrun_is_posted_flagged_counted_and_blocks_the_account(
    overrun_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Contract 1's one exception: the world cost more than the hold. It is posted
    (never refused), flagged and counted, and the account admits nothing more until
    compensation brings it back under its limit. Here the agent reports it: its
    route is compensable and takes overrun reports (up to the face value, 1000 USD),
    and its principal's limit is 500 USD."""
    tenant = overrun_tenant
    me = tenant.auth("deployer-01")
    created = await create(http, tenant, "d1")
    hold, price = created.json()["hold"], int(created.headers["x-irrev-price"])
    realised = 1000 * 10**6
    assert price < realised
    posted = await http.post(f"/v1/holds/{hold}/post", json={"amount_micros": realised}, headers=me)
    assert posted.status_code == 200, posted.text
    assert posted.json() == {"hold": hold, "state": "posted", "flags": ["overrun"]}
    platform = (await balances(http, gateway.admin, tenant))["principal:platform"]
    assert platform["posted"] == realised > platform["limit"]

    blocked = assert_problem(await create(http, tenant, "d2"), 403, "budget_exceeded")
    assert blocked["ledger_reason"] == "over_limit"
    metrics = (await http.get("/metrics", headers=gateway.admin)).text
    assert f'irrev_flagged_outcomes_total{{flag="overrun",tenant="{tenant.id}"}} 1.0' in metrics

    recovered = 600 * 10**6
    back = await http.post(
        f"/v1/holds/{hold}/compensate", json={"recovered_micros": recovered}, headers=me
    )
    assert back.status_code == 200, back.text
    assert (await create(http, tenant, "d3")).status_code in (201, 202)


async def test_void_and_ambiguous(
    decision_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = decision_tenant
    me = tenant.auth("deployer-01")
    before = used(await balances(http, gateway.admin, tenant))

    voided = (await create(http, tenant, "deploy-void")).json()["hold"]
    response = await http.post(f"/v1/holds/{voided}/void", headers=me)
    assert response.json() == {"hold": voided, "state": "voided"}
    assert used(await balances(http, gateway.admin, tenant)) == before
    # A repeat of the key replays the (voided) hold: it never debits again.
    replay = await create(http, tenant, "deploy-void")
    assert (replay.status_code, replay.json()["state"]) == (200, "voided")
    assert used(await balances(http, gateway.admin, tenant)) == before

    unsure = (await create(http, tenant, "deploy-unsure")).json()["hold"]
    response = await http.post(f"/v1/holds/{unsure}/ambiguous", json={}, headers=me)
    assert response.json()["state"] == "ambiguous"
    assert platform_used(used(await balances(http, gateway.admin, tenant))) == (
        platform_used(before) + PRICE
    )
    # The caller learns the deploy did happen: the ambiguous hold posts.
    response = await http.post(f"/v1/holds/{unsure}/post", json={}, headers=me)
    assert response.json()["state"] == "posted"


async def test_decision_api_refuses_proxied_routes_and_vice_versa(
    decision_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = decision_tenant
    proxied = await http.post(
        "/v1/holds",
        json={"tool": "supplier", "method": "POST", "path": "/orders", "body": order()},
        headers=effect_headers(tenant, "buyer-01", "proxied"),
    )
    assert_problem(proxied, 403, "route_is_proxied")
    missing_key = await http.post("/v1/holds", json=DEPLOY, headers=tenant.auth("deployer-01"))
    assert_problem(missing_key, 400, "idempotency_key_required")
    unknown = await http.post(
        "/v1/holds",
        json={**DEPLOY, "path": "/rollbacks"},
        headers=effect_headers(tenant, "deployer-01", "unknown"),
    )
    assert_problem(unknown, 403, "unknown_route")
    # A buyer's per-effect cap is 50000 USD, a deployer's 1000 USD: the deploy fits
    # the deployer's; anything another agent does not own is not found.
    hold = (await create(http, tenant, "deploy-owned")).json()["hold"]
    other = await http.post(f"/v1/holds/{hold}/post", json={}, headers=tenant.auth("buyer-01"))
    assert_problem(other, 404, "not_found")


async def test_budget_runs_out_into_escalation_then_denial(
    decision_budget_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """platform's limit is 10000 USD with a soft band at 80%: 1000 USD deploys are
    admitted up to 8000, escalated to 10000, then denied; never above the limit."""
    tenant = decision_budget_tenant
    statuses = [(await create(http, tenant, f"budget-{i}")).status_code for i in range(12)]
    assert statuses == [201] * 8 + [202] * 2 + [403] * 2
    rows = await balances(http, gateway.admin, tenant)
    platform = rows["principal:platform"]
    assert platform["pending"] + platform["posted"] == platform["limit"] == 10_000 * 10**6


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"],
    ids=["missing", "text", "form", "jsonx"],
)
async def test_a_body_that_does_not_say_it_is_json_is_refused_415(
    decision_tenant: Tenant, http: httpx.AsyncClient, content_type: str | None
) -> None:
    """The routes read their bodies by hand; as body parameters they took only JSON
    (FastAPI's strict content type: a body without a Content-Type was refused too).
    Nothing is held, and nothing is read as JSON that its sender did not call JSON."""
    tenant = decision_tenant
    headers = effect_headers(tenant, "deployer-01", f"typed-{content_type}")
    headers.pop("Content-Type", None)
    if content_type is not None:
        headers["Content-Type"] = content_type
    body = json.dumps(DEPLOY).encode()
    refused = await http.post("/v1/holds", content=body, headers=headers)
    problem = assert_problem(refused, 415, "unsupported_media_type")
    assert "application/json" in problem["detail"] and problem["retry"] == "fix"
    headers["Content-Type"] = "application/json; charset=utf-8"
    created = await http.post("/v1/holds", content=body, headers=headers)
    assert created.status_code == 201, created.text
    hold = created.json()["hold"]
    settle = {k: v for k, v in headers.items() if k != "Content-Type"}
    if content_type is not None:
        settle["Content-Type"] = content_type
    refused = await http.post(f"/v1/holds/{hold}/post", content=b"{}", headers=settle)
    assert_problem(refused, 415, "unsupported_media_type")
    # No body has no type to check: refused for what is missing, as before.
    empty = await http.post(f"/v1/holds/{hold}/post", headers=settle)
    assert_problem(empty, 422, "bad_request")
    # A JSON-based media type is JSON.
    typed = {**settle, "Content-Type": "application/merge-patch+json"}
    posted = await http.post(f"/v1/holds/{hold}/post", content=b"{}", headers=typed)
    assert posted.status_code == 200, posted.text


@pytest.mark.parametrize(
    "content_type",
    [
        "application/foo, application/x+json",
        "application/json; v=1, text/plain",
        "application/x +json",
        "application/x@y+json",
    ],
    ids=["list", "list-after-parameters", "space", "not-a-token"],
)
async def test_a_content_type_that_is_not_one_media_type_is_refused_415(
    decision_tenant: Tenant, http: httpx.AsyncClient, content_type: str
) -> None:
    """A Content-Type is one media type (RFC 9110): a header holding a list of them,
    or a type with a space or a character no token has, is read as another type by a
    reader that splits it or parses it strictly. Refused before anything is held, so
    every case can use one key."""
    headers = effect_headers(decision_tenant, "deployer-01", "one-media-type")
    headers["Content-Type"] = content_type
    body = json.dumps(DEPLOY).encode()
    refused = await http.post("/v1/holds", content=body, headers=headers)
    assert_problem(refused, 415, "unsupported_media_type")
