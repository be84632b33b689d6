"""An operator stops a hostile agent fleet-wide and lets it back (docs/operations.md,
"Stop an agent"): `POST .../agents/{agent}/suspend` and `/resume` are policy changes
made from the store's current version, so every host serves them within its refresh;
a suspended agent is refused `agent_suspended` on the proxy, the decision API and MCP,
with its managed keys too, and counted among the tenant's refusals.

The session's gateway has two workers: a change reaches the one that wrote it at
once and the other within its refresh, so every wait for it polls a call that
changes nothing (a read, an unlisted route) until a deadline, and never sleeps."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.edge.problems import Problem
from gateway.pipeline.prepare import check_active
from gateway.state.suspensions import UnknownAgent, with_suspension
from gateway.state.tenants import TenantStore
from irrev.harness import new_token
from ledger import Ledger
from pricing.credentials import hash_token

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem, effect_headers, mcp_call, order
from .servers import EXAMPLES, Tenant

VIEWER, APPROVER, POLICY_ADMIN = new_token(), new_token(), new_token()
REASON = "loops on refunds: stopped while we look"
DEADLINE_S = 60.0  # a bound, not a delay: each wait ends once its condition holds
CATALOG = "/tools/supplier/catalog"


@pytest.fixture(scope="module")
def suspend_tenant(new_tenant: TenantMaker) -> Tenant:
    admins = {
        "val": {"token_sha256": hash_token(VIEWER), "role": "viewer"},
        "amy": {"token_sha256": hash_token(APPROVER), "role": "approver"},
        "pat": {"token_sha256": hash_token(POLICY_ADMIN), "role": "policy_admin"},
    }
    return new_tenant("suspend", admins=admins)


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def agent_path(tenant: Tenant, agent: str, verb: str) -> str:
    return f"/v1/admin/tenants/{tenant.id}/agents/{agent}/{verb}"


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"


def reason_of(response: httpx.Response) -> str:
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        return str(response.json()["reason"])
    return ""


async def refused_soon(send: Callable[[], Awaitable[httpx.Response]], what: str) -> dict[str, Any]:
    """`send` (a call that changes nothing) until it is refused agent_suspended."""
    last: list[httpx.Response] = []

    async def refused() -> bool:
        last[:] = [await send()]
        return reason_of(last[0]) == "agent_suspended"

    await until(refused, f"{what} not refused agent_suspended")
    return assert_problem(last[0], 403, "agent_suspended")


async def suspend(
    http: httpx.AsyncClient, gateway: Gateway, tenant: Tenant, agent: str
) -> dict[str, Any]:
    answer = await http.post(
        agent_path(tenant, agent, "suspend"), json={"reason": REASON}, headers=gateway.admin
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_only_a_policy_admin_or_an_operator_suspends_and_resumes(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant
) -> None:
    tenant = suspend_tenant
    for token in (VIEWER, APPROVER):
        for verb, body in (("suspend", {"reason": REASON}), ("resume", {}), ("suspend", {})):
            refused = await http.post(
                agent_path(tenant, "buyer-05", verb), json=body, headers=bearer(token)
            )
            # Told its role is too small, before anything about the body it sent.
            assert_problem(refused, 403, "insufficient_role")
    first = await http.post(
        agent_path(tenant, "buyer-05", "suspend"),
        json={"reason": REASON},
        headers=bearer(POLICY_ADMIN),
    )
    assert first.status_code == 200, first.text
    view = first.json()
    assert (view["agent"], view["state"], view["changed"]) == ("buyer-05", "suspended", True)
    assert view["suspended"]["reason"] == REASON and view["suspended"]["by"] == "pat"
    assert view["suspended"]["at"].endswith("Z")
    again = await http.post(
        agent_path(tenant, "buyer-05", "suspend"), json={"reason": "other"}, headers=gateway.admin
    )
    assert again.status_code == 200, again.text
    # Already suspended: said so, as it was suspended first, and nothing written.
    assert again.json()["changed"] is False
    assert again.json()["suspended"] == view["suspended"]
    assert again.json()["version"] == view["version"]
    listed = await http.get(f"/v1/admin/tenants/{tenant.id}/agents", headers=bearer(VIEWER))
    assert listed.status_code == 200, listed.text
    history = await http.get(
        f"/v1/admin/tenants/{tenant.id}/policy/history?limit=1", headers=gateway.admin
    )
    assert history.json()[0]["version"] == view["version"]
    assert history.json()[0]["origin"] == "suspend buyer-05 pat"
    resumed = await http.post(
        agent_path(tenant, "buyer-05", "resume"), json={"reason": "fixed"}, headers=gateway.admin
    )
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["state"], resumed.json()["changed"]) == ("active", True)
    assert resumed.json()["version"] == view["version"] + 1
    idle = await http.post(agent_path(tenant, "buyer-05", "resume"), headers=bearer(POLICY_ADMIN))
    assert idle.status_code == 200, idle.text
    assert (idle.json()["state"], idle.json()["changed"]) == ("active", False)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": ""},
        {"reason": "x" * 501},
        {"reason": "first line\nforged line"},
        {"reason": "hidden\u200btext"},
        {"reason": 5},
        {"reason": "ok", "until": "never"},
    ],
)
async def test_a_bad_reason_is_refused_and_nothing_written(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant, body: dict[str, Any]
) -> None:
    path = agent_path(suspend_tenant, "buyer-06", "suspend")
    assert_problem(await http.post(path, json=body, headers=gateway.admin), 422, "bad_request")
    listed = await http.get(f"/v1/admin/tenants/{suspend_tenant.id}/agents", headers=gateway.admin)
    assert {a["agent"]: a["state"] for a in listed.json()["agents"]}["buyer-06"] == "active"


async def test_an_unknown_agent_or_tenant_is_not_found(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant
) -> None:
    for verb in ("suspend", "resume"):
        missing = await http.post(
            agent_path(suspend_tenant, "nobody", verb),
            json={"reason": REASON},
            headers=gateway.admin,
        )
        assert_problem(missing, 404, "unknown_agent")
    other = await http.post(
        "/v1/admin/tenants/no-such-tenant/agents/buyer-01/suspend",
        json={"reason": REASON},
        headers=gateway.admin,
    )
    assert_problem(other, 404, "unknown_tenant")


async def test_a_suspended_agent_is_refused_on_every_transport_until_resumed(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant
) -> None:
    tenant, me = suspend_tenant, suspend_tenant.auth("buyer-01")
    await suspend(http, gateway, tenant, "buyer-01")
    read = await refused_soon(lambda: http.get(CATALOG, headers=me), "a read")
    assert REASON in read["detail"] and "will not help" in read["detail"]
    assert read["retry"] == "no" and read["suspended_by"] == "operator:ops"
    key = f"suspended-{time.monotonic_ns()}"
    # The same key every try: once refused on both workers, nothing was made twice.
    proxied = await refused_soon(
        lambda: http.post(
            "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-01", key)
        ),
        "an order through the proxy",
    )
    assert proxied["suspension_reason"] == REASON
    hold = {"tool": "supplier", "method": "POST", "path": "/nowhere", "body": {}}
    await refused_soon(
        lambda: http.post("/v1/holds", json=hold, headers=effect_headers(tenant, "buyer-01", key)),
        "the decision API",
    )
    body, headers = mcp_call(tenant, "buyer-01", "nowhere__tool")
    result: dict[str, Any] = {}

    async def mcp_refused() -> bool:
        called = await http.post("/mcp", content=body, headers=headers)
        assert called.status_code == 200, called.text
        result.update(called.json()["result"])
        return bool(result["structuredContent"]["reason"] == "agent_suspended")

    await until(mcp_refused, "an MCP tool call not refused agent_suspended")
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert "irrev did not make this call" in text and REASON in text and "will not help" in text
    assert result["structuredContent"]["retry"] == "no"

    async def counted() -> bool:
        view = await http.get(
            f"/v1/admin/tenants/{tenant.id}/refusals?minutes=5", headers=gateway.admin
        )
        rows = view.json()["rows"]
        seen = {(r["transport"], r["agent"]) for r in rows if r["reason"] == "agent_suspended"}
        return {("http", "buyer-01"), ("mcp", "buyer-01")} <= seen

    await until(counted, "the refusals were not counted")
    resumed = await http.post(agent_path(tenant, "buyer-01", "resume"), headers=gateway.admin)
    assert resumed.status_code == 200, resumed.text

    async def back() -> bool:
        return (await http.get(CATALOG, headers=me)).status_code == 200

    await until(back, "the resumed agent's read not answered")
    fresh = f"resumed-{time.monotonic_ns()}"

    async def admitted() -> bool:
        sent = await http.post(
            "/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "buyer-01", fresh),
        )
        assert sent.is_success or reason_of(sent) == "agent_suspended", sent.text
        return sent.is_success

    await until(admitted, "the resumed agent's order not admitted")


async def test_a_managed_key_of_a_suspended_agent_is_refused(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant
) -> None:
    created = await http.post(
        f"/v1/admin/tenants/{suspend_tenant.id}/keys",
        json={"kind": "agent", "agent": "buyer-03", "owner": "the suspend test"},
        headers=gateway.admin,
    )
    assert created.status_code in (200, 201), created.text
    key = bearer(created.json()["token"])

    async def opens() -> bool:
        return (await http.get(CATALOG, headers=key)).status_code == 200

    await until(opens, "the managed key never opened its agent")
    await suspend(http, gateway, suspend_tenant, "buyer-03")
    await refused_soon(lambda: http.get(CATALOG, headers=key), "a managed key's read")
    await http.post(agent_path(suspend_tenant, "buyer-03", "resume"), headers=gateway.admin)
    await until(opens, "the managed key did not open its resumed agent")


async def test_another_host_refuses_within_its_refresh_and_lets_it_back(
    http: httpx.AsyncClient,
    gateway: Gateway,
    suspend_tenant: Tenant,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    tenant = suspend_tenant
    record = (await ledger.policies.records([tenant.id]))[tenant.id]
    (tmp_path / f"{tenant.id}.yaml").write_text(record.text)
    host = TenantStore(tmp_path, instance="suspend-test-host")
    await host.load(ledger)
    token = tenant.tokens["buyer-04"]
    found = host.authenticate(token)
    assert found is not None and found[1].suspended is None

    async def suspended_there(expected: bool) -> bool:
        await host.refresh(ledger)
        found = host.authenticate(token)
        assert found is not None, "a suspended agent is still authenticated, then refused"
        return (found[1].suspended is not None) == expected

    await suspend(http, gateway, tenant, "buyer-04")
    await until(lambda: suspended_there(True), "the other host never saw the suspension")
    found = host.authenticate(token)
    assert found is not None
    with pytest.raises(Problem) as refused:
        check_active(found[1])
    assert refused.value.reason == "agent_suspended" and REASON in refused.value.text
    await http.post(agent_path(tenant, "buyer-04", "resume"), headers=gateway.admin)
    await until(lambda: suspended_there(False), "the other host never saw the resume")
    check_active(host.authenticate(token)[1])  # type: ignore[index]


async def test_an_edit_made_before_a_suspension_keeps_both(
    http: httpx.AsyncClient, gateway: Gateway, suspend_tenant: Tenant
) -> None:
    tenant = suspend_tenant
    policy = f"/v1/admin/tenants/{tenant.id}/policy"
    history = f"{policy}/history?limit=1&text=true"
    newest = (await http.get(history, headers=gateway.admin)).json()[0]
    base, document = newest["version"], yaml.safe_load(newest["text"])
    etag = f'"{base}-{newest["digest"]}"'
    suspended = await suspend(http, gateway, tenant, "buyer-02")
    assert suspended["version"] == base + 1
    # Someone's edit of another field, made from the version before the suspension.
    document["accounts"]["tenant"]["limit"] = "123456"
    uploaded = await http.put(
        policy,
        content=yaml.safe_dump(document, sort_keys=False),
        headers={**gateway.admin, "If-Match": etag, "Content-Type": "application/yaml"},
    )
    assert uploaded.status_code == 200, uploaded.text
    stored = yaml.safe_load((await http.get(history, headers=gateway.admin)).json()[0]["text"])
    assert stored["accounts"]["tenant"]["limit"] == "123456"
    assert stored["agents"]["buyer-02"]["suspended"]["reason"] == REASON
    # And a suspension made from a version older than the store's keeps the edit too.
    resumed = await http.post(agent_path(tenant, "buyer-02", "resume"), headers=gateway.admin)
    assert resumed.status_code == 200, resumed.text
    stored = yaml.safe_load((await http.get(history, headers=gateway.admin)).json()[0]["text"])
    assert stored["accounts"]["tenant"]["limit"] == "123456"
    assert "suspended" not in stored["agents"]["buyer-02"]


SUSPENSION = {
    "reason": 'says "stop" \\ now: é',
    "by": "operator:ops",
    "at": "2026-12-06T05:00:00.000Z",
}


def test_a_suspension_is_one_line_of_the_policy_text_and_its_comments_stay() -> None:
    text = (EXAMPLES / "procurement.yaml").read_text()
    suspended = with_suspension(text, "procurement.yaml", "buyer-02", SUSPENSION)
    assert [line for line in suspended.splitlines() if line not in text.splitlines()] == [
        '    suspended: {"reason": "says \\"stop\\" \\\\ now: é", "by": "operator:ops", '
        '"at": "2026-12-06T05:00:00.000Z"}'
    ]
    assert yaml.safe_load(suspended)["agents"]["buyer-02"]["suspended"] == SUSPENSION
    assert with_suspension(suspended, "procurement.yaml", "buyer-02", None) == text


def test_a_policy_whose_layout_has_no_line_for_it_is_written_whole() -> None:
    document = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    text = yaml.safe_dump(document, default_flow_style=True)  # every agent on one line
    suspended = with_suspension(text, "flow.yaml", "buyer-02", SUSPENSION)
    document["agents"]["buyer-02"]["suspended"] = SUSPENSION
    assert yaml.safe_load(suspended) == document
    # Written whole, the suspension is a block mapping: resumed, all of it goes.
    resumed = with_suspension(suspended, "flow.yaml", "buyer-02", None)
    del document["agents"]["buyer-02"]["suspended"]
    assert yaml.safe_load(resumed) == document
    assert [line for line in resumed.splitlines() if line not in suspended.splitlines()] == []
    with pytest.raises(UnknownAgent):
        with_suspension(text, "flow.yaml", "nobody", SUSPENSION)
