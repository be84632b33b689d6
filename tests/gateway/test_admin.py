"""The admin API: policies (show, upload, reload), the journal, the escalation queue."""

from __future__ import annotations

import httpx
import pytest
import yaml

from gateway.state.policies import ledger_errors, policy_version
from ledger import Ledger
from pricing import load_policy_data

from .conftest import Gateway, TenantMaker, policy_dir_of
from .helpers import assert_problem, balances, base_of, based, effect_headers, order
from .servers import EXAMPLES, Tenant


@pytest.fixture(scope="module")
def admin_a_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("admin-a")


@pytest.fixture(scope="module")
def admin_b_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("admin-b")


def policy_file(gateway: Gateway, tenant: Tenant) -> str:
    return (policy_dir_of(gateway) / f"{tenant.id}.yaml").read_text()


async def test_upload_applies_a_valid_policy(
    admin_a_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = admin_a_tenant
    shown = await http.get(f"/v1/admin/tenants/{tenant.id}/policy", headers=gateway.admin)
    assert shown.status_code == 200 and shown.json()["tenant"] == tenant.id
    data = yaml.safe_load(policy_file(gateway, admin_a_tenant))
    data["accounts"]["principals"]["platform"]["limit"] = "12000"
    text = yaml.safe_dump(data, sort_keys=False)
    response = await http.put(
        f"/v1/admin/tenants/{tenant.id}/policy",
        content=text,
        headers={**gateway.admin, **base_of(shown)},
    )
    version = int(shown.headers["etag"].strip('"').partition("-")[0]) + 1
    assert response.json() == {"tenant": tenant.id, "status": "applied", "version": version}
    assert response.headers["etag"] == f'"{version}-{policy_version(text)}"'
    rows = await balances(http, gateway.admin, tenant)
    assert rows["principal:platform"]["limit"] == 12_000 * 10**6
    yaml_accept = {**gateway.admin, "Accept": "application/yaml"}
    served = await http.get(f"/v1/admin/tenants/{tenant.id}/policy", headers=yaml_accept)
    assert served.text == text and served.headers["etag"] == response.headers["etag"]
    # The store is the truth; the host's file is one way in, and is not rewritten.
    assert policy_file(gateway, admin_a_tenant) != text


async def test_upload_that_would_break_the_policy_set_changes_nothing(
    admin_a_tenant: Tenant, admin_b_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Valid on its own, but reusing another tenant's agent token: refused, and the
    directory stays loadable (by a reload now, and by the next `irrev serve`)."""
    a, b = admin_a_tenant, admin_b_tenant
    before = policy_file(gateway, admin_b_tenant)
    data = yaml.safe_load(before)
    stolen = yaml.safe_load(policy_file(gateway, admin_a_tenant))["agents"]["buyer-01"][
        "token_sha256"
    ]
    data["agents"]["buyer-02"]["token_sha256"] = stolen
    response = await http.put(
        f"/v1/admin/tenants/{b.id}/policy",
        content=yaml.safe_dump(data, sort_keys=False),
        headers=await based(http, b.id, gateway.admin),
    )
    assert_problem(response, 422, "invalid_policy")
    assert policy_file(gateway, admin_b_tenant) == before
    reload = await http.post("/v1/admin/policies/reload", headers=gateway.admin)
    assert reload.status_code == 200, reload.text
    assert {a.id, b.id} <= set(reload.json()["tenants"])
    # Both agents still authenticate as themselves.
    for tenant, agent in ((a, "buyer-01"), (b, "buyer-02")):
        read = await http.get("/tools/supplier/catalog", headers=tenant.auth(agent))
        assert read.status_code == 200, read.text


async def test_an_upload_the_ledger_would_refuse_writes_nothing(
    admin_a_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """A policy whose accounts the ledger cannot keep (here an exact risk factor's
    account id past 128 characters) passed validation: the store took it as a new
    version and its other limits went live before the ledger refused that account,
    and a 422 came back with all of it written (with the uploader killed then, every
    host's reload failed on it). It is refused before anything is written now."""
    tenant = admin_a_tenant
    before = policy_file(gateway, admin_a_tenant)
    ledger = Ledger.from_url(gateway.redis_url)
    try:
        [stored] = (await ledger.policies.records([tenant.id])).values()
        limits = {
            a: row["limit"] for a, row in (await balances(http, gateway.admin, tenant)).items()
        }
        data = yaml.safe_load(before)
        data["accounts"]["tenant"]["limit"] = "777777"
        data["accounts"]["risk_factors"]["supplier:" + "x" * 150] = {"limit": "10"}
        response = await http.put(
            f"/v1/admin/tenants/{tenant.id}/policy",
            content=yaml.safe_dump(data, sort_keys=False),
            headers=await based(http, tenant.id, gateway.admin),
        )
        body = assert_problem(response, 422, "invalid_policy")
        assert "128" in str(body)
        assert policy_file(gateway, admin_a_tenant) == before
        [after] = (await ledger.policies.records([tenant.id])).values()
        assert after.version == stored.version
        now = await balances(http, gateway.admin, tenant)
        assert {a: row["limit"] for a, row in now.items()} == limits
    finally:
        await ledger.aclose()


async def test_upload_refuses_invalid_or_foreign_policies(
    admin_a_tenant: Tenant, admin_b_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    a, b = admin_a_tenant, admin_b_tenant
    url = f"/v1/admin/tenants/{a.id}/policy"
    for text in ("", "tenant: [", "kind: demo-tokens", policy_file(gateway, admin_b_tenant)):
        before = policy_file(gateway, admin_a_tenant)
        headers = await based(http, a.id, gateway.admin)
        response = await http.put(url, content=text.encode(), headers=headers)
        assert_problem(response, 422, "invalid_policy")
        assert policy_file(gateway, admin_a_tenant) == before
    assert b.id != a.id


async def test_journal_pages_and_escalation_queue(
    admin_b_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = admin_b_tenant
    admitted = await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-03", "j1")
    )
    assert admitted.status_code == 201, admitted.text
    escalated = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=450),
        headers=effect_headers(tenant, "buyer-04", "j2"),
    )
    assert escalated.status_code == 202, escalated.text

    url = f"/v1/admin/tenants/{tenant.id}/journal"
    first = (await http.get(url, params={"count": 1}, headers=gateway.admin)).json()
    assert len(first["entries"]) == 1 and first["next"]
    rest = (
        await http.get(url, params={"after": first["next"], "count": 1000}, headers=gateway.admin)
    ).json()
    assert rest["next"] is None
    assert first["entries"][0] not in rest["entries"]
    assert len(first["entries"] + rest["entries"]) >= 3  # reserve, post, reserve
    # A cursor past the end, or past any possible id, is an empty page, not an error.
    for after in ("99999999999999-0", "18446744073709551615-18446744073709551615"):
        page = await http.get(url, params={"after": after}, headers=gateway.admin)
        assert page.status_code == 200, page.text
        assert page.json() == {"entries": [], "next": None}
    bad = await http.get(url, params={"after": "99999999999999999999-0"}, headers=gateway.admin)
    assert_problem(bad, 422, "bad_request")

    queue = (
        await http.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gateway.admin)
    ).json()
    [item] = queue["escalations"]
    assert item["agent"] == "buyer-04"
    assert item["price"] == int(escalated.headers["x-irrev-price"])
    assert f"/v1/escalations/{item['escalation']}" == escalated.headers["location"]
    tenants = (await http.get("/v1/admin/tenants", headers=gateway.admin)).json()
    [row] = [t for t in tenants if t["tenant"] == tenant.id]
    assert row["live_holds"]["escalated"] == 1


def test_a_wildcard_whose_accounts_would_all_be_too_long_is_refused() -> None:
    """`supplier:xxx...*` past the ledger's id length opens no account at load, and
    then every request on its routes would fail at the ledger: refused up front."""
    document = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    document["accounts"]["risk_factors"]["supplier:" + "x" * 115 + "*"] = {"limit": "10"}
    policy = load_policy_data(document, "p.yaml")
    [error] = ledger_errors("p.yaml", policy)
    assert "too long" in str(error) and "128" in str(error)
    del document["accounts"]["risk_factors"]["supplier:" + "x" * 115 + "*"]
    document["accounts"]["risk_factors"]["supplier:" + "x" * 111 + "*"] = {"limit": "10"}
    assert ledger_errors("p.yaml", load_policy_data(document, "p.yaml")) == []
