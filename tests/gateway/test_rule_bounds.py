"""Who may set which rule, and how far one reaches (hostile reviews' findings): an
approver took a tenant to twice its limit for a year with raises of 2^53-1 and an
unbounded auto-approval; an approver ended a policy_admin's raise; a tenant admin
named like an operator had its decisions recorded under the operator's name; a raise
took a limit past 2^53-1, where the ledger's arithmetic rounds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from irrev.harness import new_token
from pricing.credentials import hash_token

from .conftest import Gateway, own_gateway, policy_dir_of
from .helpers import assert_problem, balances, based, effect_headers, order
from .servers import Server

ADMINS = {
    "viewer-1": "viewer",
    "approver-1": "approver",
    "boss": "policy_admin",
    "ops": "approver",
}
MAX_MAJOR = "9007199254.740991"  # 2^53-1 micros: the largest amount the ledger holds


@pytest.fixture(scope="module")
def admins() -> dict[str, str]:
    """Admin name -> token. `ops` is also the operator's name (IRREV_ADMIN_TOKENS)."""
    return {name: new_token() for name in ADMINS}


@pytest.fixture(scope="module")
def rules_gateway(
    redis_url: str,
    suppliers: Server,
    tmp_path_factory: pytest.TempPathFactory,
    admins: dict[str, str],
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("rule-bounds")
    policy = {
        "admins": {
            name: {"token_sha256": hash_token(admins[name]), "role": role}
            for name, role in ADMINS.items()
        }
    }
    with own_gateway(redis_url, suppliers, root, 1, policy) as gateway:
        yield gateway


@pytest.fixture
async def client(rules_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=rules_gateway.url, timeout=30, trust_env=False) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rule(kind: str, duration: str = "1h", **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "duration": duration, "reason": "quarter end", **fields}


async def test_only_a_policy_admin_raises_a_limit_and_at_most_to_double(
    rules_gateway: Gateway, client: httpx.AsyncClient, admins: dict[str, str]
) -> None:
    gw, tenant = rules_gateway, rules_gateway.tenant("own")
    url = f"/v1/admin/tenants/{tenant.id}/rules"
    approver, boss = bearer(admins["approver-1"]), bearer(admins["boss"])
    # The attack: an approver raising every account of an effect by 2^53-1 for a year.
    for account in ("tenant:" + tenant.id, "principal:procurement", "agent:buyer-02"):
        huge = rule("raise_limit", "366d", account=account, amount=MAX_MAJOR)
        assert_problem(
            await client.post(url, json=huge, headers=approver), 403, "insufficient_role"
        )
    assert (await client.get(url, headers=gw.admin)).json()["rules"] == []

    # A policy admin may, within bounds: the live raises of an account sum to at most
    # its own limit (agent:buyer-02: 100,000 USD), for at most 7 days.
    for amount, duration in ((MAX_MAJOR, "1h"), ("100000.000001", "1h"), ("1000", "8d")):
        refused = await client.post(
            url,
            json=rule("raise_limit", duration, account="agent:buyer-02", amount=amount),
            headers=boss,
        )
        assert_problem(refused, 422, "bad_rule")
    first = rule("raise_limit", "7d", account="agent:buyer-02", amount="60000")
    assert (await client.post(url, json=first, headers=boss)).status_code == 201
    more = rule("raise_limit", account="agent:buyer-02", amount="40000.000001")
    body = assert_problem(await client.post(url, json=more, headers=boss), 422, "bad_rule")
    assert "at most doubles" in body["detail"]
    rest = await client.post(url, json={**more, "amount": "40000"}, headers=boss)
    assert rest.status_code == 201, rest.text
    rows = await balances(client, gw.admin, tenant)
    assert rows["agent:buyer-02"]["effective_limit"] == 200_000 * 10**6
    for raised in (await client.get(url, headers=gw.admin)).json()["rules"]:
        deleted = await client.delete(f"{url}/{raised['rule']}", headers=boss)
        assert deleted.status_code == 200, deleted.text


async def test_a_rule_is_ended_only_by_a_role_that_may_set_it(
    rules_gateway: Gateway, client: httpx.AsyncClient, admins: dict[str, str]
) -> None:
    """Issue 26: an approver deleted a policy_admin's raise_limit rule. A raise that a
    policy_admin set for a quarter-end is a budget decision; ending it early is one
    too, so it takes the role that sets it. An auto_approve rule stays an approver's
    to set and to end; a viewer ends neither."""
    gw, tenant = rules_gateway, rules_gateway.tenant("own")
    url = f"/v1/admin/tenants/{tenant.id}/rules"
    viewer, approver = bearer(admins["viewer-1"]), bearer(admins["approver-1"])
    boss = bearer(admins["boss"])
    raise_rule = rule("raise_limit", account="principal:procurement", amount="1000")
    raised = await client.post(url, json=raise_rule, headers=boss)
    assert raised.status_code == 201, raised.text
    auto = rule("auto_approve", agent="buyer-03", max_price="500")
    approving = await client.post(url, json=auto, headers=approver)
    assert approving.status_code == 201, approving.text
    raise_id, auto_id = raised.json()["rule"], approving.json()["rule"]

    for rule_id, who in ((raise_id, approver), (raise_id, viewer), (auto_id, viewer)):
        refused = await client.delete(f"{url}/{rule_id}", headers=who)
        body = assert_problem(refused, 403, "insufficient_role")
        assert body["needed"] == ("policy_admin" if rule_id == raise_id else "approver")
    live = {r["rule"] for r in (await client.get(url, headers=gw.admin)).json()["rules"]}
    assert {raise_id, auto_id} <= live
    rows = await balances(client, gw.admin, tenant)
    assert rows["principal:procurement"]["raised"] == 1000 * 10**6

    # Whoever may set a rule ends it; a rule that is not there is not found, for any role
    # that may end rules at all.
    assert (await client.delete(f"{url}/{auto_id}", headers=approver)).status_code == 200
    assert (await client.delete(f"{url}/{raise_id}", headers=boss)).status_code == 200
    assert_problem(await client.delete(f"{url}/{raise_id}", headers=approver), 404, "not_found")
    assert_problem(
        await client.delete(f"{url}/r-nosuchrule", headers=viewer), 403, "insufficient_role"
    )
    rows = await balances(client, gw.admin, tenant)
    assert rows["principal:procurement"]["raised"] == 0


async def test_an_auto_approval_is_bounded_by_the_caps_it_covers_and_a_week(
    rules_gateway: Gateway, client: httpx.AsyncClient, admins: dict[str, str]
) -> None:
    tenant = rules_gateway.tenant("own")
    url = f"/v1/admin/tenants/{tenant.id}/rules"
    approver = bearer(admins["approver-1"])
    for bad in (
        rule("auto_approve", "366d", principal="procurement", max_price=MAX_MAJOR),
        # procurement's agents have a per_effect_cap of 50,000 USD.
        rule("auto_approve", principal="procurement", max_price="50000.000001"),
        rule("auto_approve", agent="buyer-02", max_price="50000.000001"),
        rule("auto_approve", "8d", agent="buyer-02", max_price="5000"),
    ):
        refused = await client.post(url, json=bad, headers=approver)
        assert_problem(refused, 422, "bad_rule")
    ok = rule("auto_approve", "7d", principal="procurement", max_price="50000")
    created = await client.post(url, json=ok, headers=approver)
    assert created.status_code == 201, created.text
    deleted = await client.delete(f"{url}/{created.json()['rule']}", headers=approver)
    assert deleted.status_code == 200, deleted.text


async def test_a_tenant_admin_named_like_the_operator_is_never_recorded_as_it(
    rules_gateway: Gateway, client: httpx.AsyncClient, admins: dict[str, str]
) -> None:
    gw, tenant = rules_gateway, rules_gateway.tenant("own")
    events = f"/v1/admin/tenants/{tenant.id}/events"
    start = (await client.get(events, params={"limit": 1000}, headers=gw.admin)).json()["next"]
    decided = []
    for agent, who in (("buyer-03", bearer(admins["ops"])), ("buyer-04", gw.admin)):
        escalated = await client.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id=f"s-{agent}"),  # above the 30,000 threshold
            headers=effect_headers(tenant, agent, f"named-{agent}"),
        )
        assert escalated.status_code == 202, escalated.text
        approved = await client.post(f"{escalated.headers['location']}/approve", headers=who)
        assert approved.status_code == 201, approved.text
        decided.append(approved.headers["x-irrev-hold"])
    page = (await client.get(events, params={"after": start}, headers=gw.admin)).json()
    by = {e["hold"]: e["by"] for e in page["events"] if e["type"] == "hold.approved"}
    # The tenant's own `ops` keeps its name; the operator's is one no member id can take.
    assert [by[hold] for hold in decided] == ["ops", "operator:ops"]
    journal = (await client.get(f"/v1/admin/tenants/{tenant.id}/journal", headers=gw.admin)).json()
    approvals = [e for e in journal["entries"] if e.get("op") == "approve"]
    assert {e["by"] for e in approvals} == {"ops", "operator:ops"}


async def test_a_raise_never_takes_a_limit_past_2_53(
    rules_gateway: Gateway, client: httpx.AsyncClient, admins: dict[str, str]
) -> None:
    """The attack's setup: limits uploaded at 2^53-1, then raised on top. Past 2^53-1
    Lua's doubles round and the ledger loses micros, so the raise is refused."""
    gw, tenant = rules_gateway, rules_gateway.tenant("own")
    boss = bearer(admins["boss"])
    data = yaml.safe_load((policy_dir_of(gw) / f"{tenant.id}.yaml").read_text())
    data["accounts"]["tenant"]["limit"] = MAX_MAJOR
    uploaded = await client.put(
        f"/v1/admin/tenants/{tenant.id}/policy",
        content=yaml.safe_dump(data),
        headers=await based(client, tenant.id, boss),
    )
    assert uploaded.status_code == 200, uploaded.text
    url = f"/v1/admin/tenants/{tenant.id}/rules"
    micro = rule("raise_limit", account=f"tenant:{tenant.id}", amount="0.000001")
    body = assert_problem(await client.post(url, json=micro, headers=gw.admin), 422, "bad_rule")
    assert "2^53-1" in body["detail"]
    rows = await balances(client, gw.admin, tenant)
    assert rows[f"tenant:{tenant.id}"]["effective_limit"] == 2**53 - 1
