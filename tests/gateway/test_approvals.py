"""The approval loop's admin API on a real gateway: the queue with its context, a
reason that reaches the agent and the journal, holds by id, resolving an ambiguous
hold by hand, bounded-time auto-approval rules, and the events feed."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from .conftest import UPSTREAM_TIMEOUT_S, Gateway, own_gateway
from .helpers import assert_problem, balances, effect_headers, ledger_audit, order, set_faults
from .servers import Server

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
BIG = 450  # 450 x 100 USD: priced above the orders route's 30,000 USD approval threshold
# Room for every test's escalations: only an agent's own account (100,000 USD) binds.
ROOMY = {
    "tenant": {"limit": "10000000"},
    "principals": {
        name: {"limit": "10000000"} for name in ("procurement", "facilities", "finance", "platform")
    },
    "risk_factors": {"supplier:*": {"limit": "10000000"}, "customer:*": {"limit": "10000"}},
}


@pytest.fixture(scope="module")
def loop_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("approvals")
    with own_gateway(
        redis_url,
        suppliers,
        root,
        1,
        {"accounts": ROOMY},
        # The shared gateway's wait: its approved orders are honest forwards, which a
        # loaded machine can take longer than 1 s to answer.
        IRREV_UPSTREAM_TIMEOUT_S=str(UPSTREAM_TIMEOUT_S),
        IRREV_FORWARD_MARGIN_S="0.5",
    ) as gateway:
        yield gateway


@pytest.fixture
async def client(loop_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=loop_gateway.url, timeout=30, trust_env=False) as c:
        yield c


async def escalate(gw: Gateway, http: httpx.AsyncClient, agent: str, key: str) -> str:
    tenant = gw.tenant("own")
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=BIG),
        headers=effect_headers(tenant, agent, key),
    )
    assert response.status_code == 202, response.text
    return str(response.json()["escalation"])


async def test_queue_items_carry_who_what_how_much_and_which_account(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    escalation = await escalate(gw, client, "buyer-01", "queue-1")
    queue = await client.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gw.admin)
    [item] = [i for i in queue.json()["escalations"] if i["escalation"] == escalation]
    assert item["agent"] == "buyer-01" and item["principal"] == "procurement"
    assert item["route"] == "supplier POST /orders" and item["currency"] == "USD"
    assert item["face_value"] == 45_000 * 10**6
    assert item["face_value_text"] == "45,000 USD"
    assert item["price_text"].endswith(" USD") and item["price"] > 30_000 * 10**6
    assert item["reason"] == "approval_threshold"
    # The route's threshold escalated it: no account tripped.
    assert item["tripped"]["account"] is None
    assert item["tripped"]["threshold_text"] == "30,000 USD"
    assert RFC3339.match(item["created_at"]) and RFC3339.match(item["deadline_at"])
    assert 0 <= item["age_s"] <= item["age_s"] + item["expires_in_s"] <= 30 * 60

    # A soft band: buyer-02's own account (100,000 USD, band 80%) fills up first.
    for n in range(10):
        admitted = await client.post(
            "/tools/supplier/orders",
            json=order(quantity=280, supplier_id=f"s-soft-{n}"),
            headers=effect_headers(tenant, "buyer-02", f"soft-{n}"),
        )
        assert admitted.status_code in (201, 202), admitted.text
        if admitted.status_code == 202:
            break
    queue = await client.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gw.admin)
    banded = [i for i in queue.json()["escalations"] if i["reason"] == "soft_band"]
    assert banded, queue.json()
    tripped = banded[0]["tripped"]
    assert tripped["account"] == "agent:buyer-02"
    assert tripped["limit_text"] == "100,000 USD" and tripped["threshold_text"] == "80,000 USD"
    assert tripped["utilisation"] > 0.8


async def test_a_rejection_reason_reaches_the_agent_and_the_journal(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    escalation = await escalate(gw, client, "buyer-03", "reject-1")
    why = "not this quarter — ask finance"
    rejected = await client.post(
        f"/v1/escalations/{escalation}/reject", json={"reason": why}, headers=gw.admin
    )
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["note"] == why
    poll = await client.get(f"/v1/escalations/{escalation}", headers=tenant.auth("buyer-03"))
    body = assert_problem(poll, 403, "escalation_rejected")
    assert body["note"] == why and why in body["detail"] and body["by"] == "operator:ops"
    journal = await client.get(
        f"/v1/admin/tenants/{tenant.id}/journal", params={"count": 1000}, headers=gw.admin
    )
    [entry] = [e for e in journal.json()["entries"] if e["op"] == "reject"]
    assert entry["note"] == why and entry["by"] == "operator:ops"


async def test_bad_reasons_are_refused_and_change_nothing(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw = loop_gateway
    escalation = await escalate(gw, client, "buyer-04", "bad-reason")
    # Line and paragraph separators, bidi overrides and zero-width characters (Zl,
    # Zp, Cf) forge lines and reorder text as surely as controls: accepted before.
    spoofs = ["ok\u2028forged", "ok\u2029forged", "paid \u202e0001", "a\u200bb", "\ufeffx"]
    bodies = [{"reason": "line\nforged"}, {"reason": "x" * 501}, {"why": "extra"}]
    for body in bodies + [{"reason": spoof} for spoof in spoofs]:
        refused = await client.post(
            f"/v1/escalations/{escalation}/approve", json=body, headers=gw.admin
        )
        assert_problem(refused, 422, "bad_request")
    poll = await client.get(
        f"/v1/escalations/{escalation}", headers=gw.tenant("own").auth("buyer-04")
    )
    assert poll.status_code == 202 and poll.json()["status"] == "escalated"


async def test_an_approval_reason_is_in_the_poll_and_the_hold(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    escalation = await escalate(gw, client, "buyer-05", "approve-1")
    why = "urgent restock, 100% agreed by Zoë"  # not all ASCII: percent-encoded in a header
    approved = await client.post(
        f"/v1/escalations/{escalation}/approve", json={"reason": why}, headers=gw.admin
    )
    assert approved.status_code == 201, approved.text
    # The agent's poll gets the tool's answer, and who approved it and why.
    poll = await client.get(f"/v1/escalations/{escalation}", headers=tenant.auth("buyer-05"))
    assert poll.status_code == 201, poll.text
    assert poll.headers["x-irrev-escalation"] == "posted"
    assert poll.headers["x-irrev-decided-by"] == "operator:ops"
    assert unquote(poll.headers["x-irrev-note"]) == why
    hold_id = escalation.rpartition(".")[2]
    hold = await client.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold_id}", headers=gw.admin)
    assert hold.status_code == 200, hold.text
    view = hold.json()
    assert view["state"] == "posted" and view["note"] == why and view["by"] == "operator:ops"
    assert view["agent"] == "buyer-05" and view["face_value_text"] == "45,000 USD"
    assert RFC3339.match(view["created_at"])
    missing = await client.get(f"/v1/admin/tenants/{tenant.id}/holds/nope", headers=gw.admin)
    assert_problem(missing, 404, "not_found")


async def test_an_escalation_of_a_suspended_agent_is_carried_out_only_once_it_is_resumed(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """An operator suspends a hostile agent whose escalations wait in the queue: an
    approval of one (a person who had not seen the suspension) is refused and the
    hold stays escalated, nothing sent; once the agent is resumed, it is carried out."""
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    escalation = await escalate(gw, client, "buyer-11", "suspended-approval")
    hold_path = f"/v1/admin/tenants/{tenant.id}/holds/{escalation.rpartition('.')[2]}"
    agent = f"/v1/admin/tenants/{tenant.id}/agents/buyer-11"
    why = "asks for approvals under false descriptions"
    stopped = await client.post(f"{agent}/suspend", json={"reason": why}, headers=gw.admin)
    assert stopped.status_code == 200, stopped.text
    approve = f"/v1/escalations/{escalation}/approve"
    refused = await client.post(approve, json={"reason": "looks fine"}, headers=gw.admin)
    problem = assert_problem(refused, 409, "agent_suspended_escalation")
    assert why in problem["detail"] and "resume" in problem["detail"]
    assert problem["suspension_reason"] == why and problem["suspended_at"]
    assert (await client.get(hold_path, headers=gw.admin)).json()["state"] == "escalated"
    resumed = await client.post(f"{agent}/resume", headers=gw.admin)
    assert resumed.status_code == 200, resumed.text
    approved = await client.post(approve, json={"reason": "checked"}, headers=gw.admin)
    assert approved.status_code == 201, approved.text
    assert (await client.get(hold_path, headers=gw.admin)).json()["state"] == "posted"


async def test_an_ambiguous_hold_is_resolved_by_hand_once(
    loop_gateway: Gateway, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    await set_faults(upstream, tenant, status=503)
    response = await client.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-06", "amb-1")
    )
    await set_faults(upstream, tenant)
    assert response.status_code == 502, response.text
    hold_id = response.headers["x-irrev-hold"]
    before = await balances(client, gw.admin, tenant)
    url = f"/v1/admin/tenants/{tenant.id}/holds/{hold_id}/resolve"
    no_reason = await client.post(url, json={"outcome": "voided"}, headers=gw.admin)
    assert_problem(no_reason, 422, "bad_request")
    resolved = await client.post(
        url, json={"outcome": "voided", "reason": "supplier confirms no order"}, headers=gw.admin
    )
    assert resolved.status_code == 200, resolved.text
    after = await balances(client, gw.admin, tenant)
    assert after["agent:buyer-06"]["pending"] < before["agent:buyer-06"]["pending"]
    again = await client.post(
        url, json={"outcome": "posted", "reason": "changed my mind"}, headers=gw.admin
    )
    assert_problem(again, 409, "state_conflict")
    view = (
        await client.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold_id}", headers=gw.admin)
    ).json()
    assert view["state"] == "voided" and view["resolved_by"] == "operator:ops"
    assert view["resolution_note"] == "supplier confirms no order"
    feed = await client.get(
        f"/v1/admin/tenants/{tenant.id}/events", params={"limit": 1000}, headers=gw.admin
    )
    mine = [e for e in feed.json()["events"] if e.get("hold") == hold_id]
    assert [e["type"] for e in mine] == ["hold.ambiguous", "hold.resolved"]
    assert mine[0]["cause"] == "upstream_503"
    assert mine[1]["outcome"] == "voided" and mine[1]["reason"] == "supplier confirms no order"
    # The operator's log line says who, what, how much and why.
    [line] = [e for e in gw.log_entries() if e.get("hold_id") == hold_id and "admin" in e]
    assert line["msg"] == "escalation resolved_voided" and line["admin"] == "operator:ops"
    assert (line["tenant"], line["agent"], line["route"]) == (
        tenant.id,
        "buyer-06",
        "supplier POST /orders",
    )
    assert line["price"] == int(response.headers["x-irrev-price"])
    assert line["reason"] == "supplier confirms no order"


async def test_an_auto_approval_rule_approves_within_its_bounds_until_deleted(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    rules = f"/v1/admin/tenants/{tenant.id}/rules"
    for bad in (
        {"kind": "auto_approve", "agent": "nobody", "max_price": "50000", "duration": "1h"},
        {"kind": "auto_approve", "max_price": "50000", "duration": "1h"},
        {"kind": "auto_approve", "agent": "buyer-07", "max_price": "-1", "duration": "1h"},
        {"kind": "auto_approve", "agent": "buyer-07", "max_price": "5", "duration": "forever"},
    ):
        refused = await client.post(rules, json={**bad, "reason": "r"}, headers=gw.admin)
        assert_problem(refused, 422, "bad_rule")
    created = await client.post(
        rules,
        json={
            "kind": "auto_approve",
            "agent": "buyer-07",
            "max_price": "50000",
            "duration": "1h",
            "reason": "quarter-end restock",
        },
        headers=gw.admin,
    )
    assert created.status_code == 201, created.text
    rule = created.json()
    assert rule["max_price_text"] == "50,000 USD" and RFC3339.match(rule["until"])
    listed = (await client.get(rules, headers=gw.admin)).json()["rules"]
    assert [r["rule"] for r in listed] == [rule["rule"]]

    # Within the rule: forwarded at once, journaled as the rule's approval.
    auto = await client.post(
        "/tools/supplier/orders",
        json=order(quantity=BIG),
        headers=effect_headers(tenant, "buyer-07", "auto-1"),
    )
    assert auto.status_code == 201, auto.text
    hold_id = auto.headers["x-irrev-hold"]
    view = (
        await client.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold_id}", headers=gw.admin)
    ).json()
    assert view["by"] == f"rule:{rule['rule']}" and view["state"] == "posted"
    # Another agent is not covered.
    await escalate(gw, client, "buyer-08", "auto-other")

    deleted = await client.delete(f"{rules}/{rule['rule']}", headers=gw.admin)
    assert deleted.status_code == 200, deleted.text
    assert_problem(
        await client.delete(f"{rules}/{rule['rule']}", headers=gw.admin), 404, "not_found"
    )
    await escalate(gw, client, "buyer-07", "auto-2")


async def test_a_principals_auto_approval_covers_its_agents_and_ends_by_itself(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """Any agent of the principal, for the rule's duration; nothing deletes it."""
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    rules = f"/v1/admin/tenants/{tenant.id}/rules"
    created = await client.post(
        rules,
        json={
            "kind": "auto_approve",
            "principal": "procurement",
            "max_price": "50000",
            "duration": "3s",
            "reason": "stocktake",
        },
        headers=gw.admin,
    )
    assert created.status_code == 201, created.text
    rule = created.json()["rule"]
    for agent in ("buyer-12", "buyer-13"):
        auto = await client.post(
            "/tools/supplier/orders",
            json=order(quantity=BIG),
            headers=effect_headers(tenant, agent, "auto-principal"),
        )
        assert auto.status_code == 201, auto.text
        hold_id = auto.headers["x-irrev-hold"]
        view = (
            await client.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold_id}", headers=gw.admin)
        ).json()
        assert view["by"] == f"rule:{rule}" and view["agent"] == agent
    # Redis's clock passes its end: listed no more, and escalations wait for a person.
    deadline = time.monotonic() + 30
    while (await client.get(rules, headers=gw.admin)).json()["rules"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    await escalate(gw, client, "buyer-12", "auto-principal-after")


async def test_the_events_feed_lists_the_loop_in_journal_order(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")
    url = f"/v1/admin/tenants/{tenant.id}/events"
    start = (await client.get(url, params={"limit": 1000}, headers=gw.admin)).json()["next"]
    escalation = await escalate(gw, client, "buyer-09", "feed-1")
    await client.post(
        f"/v1/escalations/{escalation}/reject", json={"reason": "no"}, headers=gw.admin
    )
    page = (await client.get(url, params={"after": start}, headers=gw.admin)).json()
    kinds = [(e["type"], e.get("hold")) for e in page["events"]]
    hold_id = escalation.rpartition(".")[2]
    assert kinds == [("hold.escalated", hold_id), ("hold.rejected", hold_id)]
    escalated, rejected = page["events"]
    assert escalated["agent"] == "buyer-09" and escalated["cause"] == "approval_threshold"
    assert rejected["reason"] == "no" and rejected["by"] == "operator:ops"
    assert escalated["id"] < rejected["id"] and RFC3339.match(rejected["at"])
    empty = (await client.get(url, params={"after": page["next"]}, headers=gw.admin)).json()
    assert empty["events"] == [] and empty["next"] == page["next"]
    # Other scripts' digits are digits to \d, and a cursor Redis would refuse.
    arabic = await client.get(url, params={"after": "\u0661\u0662-\u0660"}, headers=gw.admin)
    assert_problem(arabic, 422, "bad_request")


async def test_a_temporary_raise_admits_more_and_ends_by_itself(
    loop_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    gw, tenant = loop_gateway, loop_gateway.tenant("own")

    async def buy(key: str) -> httpx.Response:
        return await client.post(
            "/tools/supplier/orders",
            json=order(quantity=280, supplier_id=key),
            headers=effect_headers(tenant, "buyer-10", key),
        )

    for n in range(10):  # fill buyer-10's own account (100,000 USD) until it refuses
        refused = await buy(f"raise-fill-{n}")
        if refused.status_code == 403:
            break
    denied = assert_problem(refused, 403, "budget_exceeded")
    assert denied["account"] == "agent:buyer-10" and denied["limit"] == 100_000 * 10**6
    rules = f"/v1/admin/tenants/{tenant.id}/rules"
    bad = await client.post(
        rules,
        json={
            "kind": "raise_limit",
            "account": "agent:nobody",
            "amount": "1",
            "duration": "1h",
            "reason": "r",
        },
        headers=gw.admin,
    )
    assert_problem(bad, 422, "bad_rule")
    raised = await client.post(
        rules,
        json={
            "kind": "raise_limit",
            "account": "agent:buyer-10",
            "amount": "100000",
            "duration": "3s",
            "reason": "month-end",
        },
        headers=gw.admin,
    )
    assert raised.status_code == 201, raised.text
    assert raised.json()["amount_text"] == "100,000 USD"
    rows = await balances(client, gw.admin, tenant)
    assert rows["agent:buyer-10"]["effective_limit"] == 200_000 * 10**6
    admitted = await buy("raise-within")
    assert admitted.status_code == 201, admitted.text

    # Nothing removes it: Redis's clock passes its end, and the base limit is back.
    deadline = time.monotonic() + 30
    while (await client.get(rules, headers=gw.admin)).json()["rules"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    after = assert_problem(await buy("raise-after"), 403, "budget_exceeded")
    assert after["limit"] == 100_000 * 10**6
    # The journal says why each admission fitted: replay finds no overdraw.
    audit = ledger_audit(gw.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_an_escalation_nobody_decides_expires_and_says_so(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    short = {"accounts": ROOMY, "escalation_ttl": "1s", "hold_ttl": "3s"}
    settings = {
        "IRREV_UPSTREAM_TIMEOUT_S": "1",
        "IRREV_FORWARD_MARGIN_S": "0.5",
        "IRREV_SWEEP_INTERVAL_S": "0.2",
    }
    with own_gateway(redis_url, suppliers, tmp_path, 1, short, **settings) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, trust_env=False) as http:
            escalation = await escalate(gw, http, "buyer-11", "expire-1")
            poll_url = f"/v1/escalations/{escalation}"
            deadline = time.monotonic() + 30
            while (
                poll := await http.get(poll_url, headers=gw.tenant("own").auth("buyer-11"))
            ).status_code == 202:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            assert_problem(poll, 403, "escalation_expired")
            feed = await http.get(
                f"/v1/admin/tenants/{gw.tenant('own').id}/events", headers=gw.admin
            )
            kinds = [e["type"] for e in feed.json()["events"]]
            assert kinds == ["hold.escalated", "hold.expired"]
