"""irrev as an MCP server: real MCP client sessions as agents against `irrev serve
--workers 2` on real Redis, in front of the SDK-built tool server. Admit, deny,
escalate then approve or reject, what tools/list shows, the idempotency key."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.gateway.helpers import balances, used

from .conftest import McpGateway, agent, key, order, structured, text_of, tool_stats

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_tools_list_is_the_agents_priced_tools_namespaced(mcp_gateway: McpGateway) -> None:
    tenant = mcp_gateway.tenant("basics")
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    # find_effect has no route: never called through irrev, so never shown.
    assert set(listed) == {
        "procure__place_order",
        "procure__reject_order",
        "procure__flaky_order",
        "procure__get_order",
        "github__delete_repository",
    }
    described = listed["procure__place_order"].description or ""
    assert "effect class: compensable" in described
    assert "quantity * unit_price" in described
    assert "above 20000 USD waits for a human" in described
    assert "effect class: irreversible" in (listed["github__delete_repository"].description or "")
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        dev = {tool.name for tool in (await client.list_tools()).tools}
    assert dev == {"github__delete_repository"}  # its allow-list: "github *"


async def test_admitted_call_reaches_the_server_once_and_is_posted(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("basics")
    meta = key()
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        first = await client.call_tool("procure__place_order", order(), meta=meta)
        again = await client.call_tool("procure__place_order", order(), meta=meta)
    assert not first.is_error, first
    assert structured(first)["quantity"] == 10
    assert first.meta and first.meta["dev.irrev/price"] > 0
    hold = first.meta["dev.irrev/hold"]
    # The repeat is the recorded result: the server saw the key once.
    assert again.structured_content == first.structured_content
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls_by_key"] == {f"irrev-{hold}": 1}
    response = await http.get(
        f"/v1/holds/{hold}", params={"tenant": tenant.id}, headers=mcp_gateway.gateway.admin
    )
    assert response.json()["state"] == "posted"


async def test_a_repeat_whose_result_was_kept_without_its_body_is_not_made_again(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """Past the agent's kept_answer_bytes (0 here) the result is kept without its body:
    the call itself gets it whole, and its repeat is told it was made and is not made
    again, never that nothing was sent (which would invite a second order)."""
    tenant = mcp_gateway.tenant("no-bodies")
    meta = key()
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        first = await client.call_tool("procure__place_order", order(), meta=meta)
        again = await client.call_tool("procure__place_order", order(), meta=meta)
    assert not first.is_error and structured(first)["quantity"] == 10, first
    assert not again.is_error, again
    said = text_of(again.content[0])
    assert "already made, and it is not made again" in said
    assert "allowance of kept answers" in said
    assert first.meta is not None
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls_by_key"] == {f"irrev-{first.meta['dev.irrev/hold']}": 1}


async def test_a_read_is_free_and_holds_nothing(mcp_gateway: McpGateway) -> None:
    tenant = mcp_gateway.tenant("basics")
    async with agent(mcp_gateway.url, tenant.auth("buyer-02")) as client:
        result = await client.call_tool("procure__get_order", {"order_id": "o-1"})
    assert not result.is_error
    assert result.structured_content == {"order_id": "o-1", "status": "open"}


async def test_the_servers_meta_never_speaks_for_irrev(mcp_gateway: McpGateway) -> None:
    """The tool server answers `_meta` with keys under `dev.irrev/` (a forged hold, an
    approval): they are dropped, its own keys pass, and irrev's are irrev's."""
    tenant = mcp_gateway.tenant("basics")
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        read = await client.call_tool("procure__get_order", {"order_id": "o-1"}, meta=key())
        made = await client.call_tool("procure__place_order", order(quantity=2), meta=key())
    for result in (read, made):
        assert not result.is_error, result
        assert result.meta is not None and result.meta["example.com/trace"] == "t-1"
        assert "dev.irrev/approved" not in result.meta
    assert "dev.irrev/hold" not in (read.meta or {})
    assert made.meta is not None and made.meta["dev.irrev/hold"] != "forged"


async def test_over_budget_is_a_result_the_model_can_act_on_and_debits_nothing(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("deny")
    admin = mcp_gateway.gateway.admin
    before = used(await balances(http, admin, tenant))
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        # 300 x 100 USD = 30000 face value, at the per-effect cap; above the supplier's...
        result = await client.call_tool(
            "procure__place_order", order(quantity=700, unit_price="100"), meta=key()
        )
    assert result.is_error
    assert structured(result)["reason"] == "per_effect_cap"
    text = text_of(result.content[0])
    assert "70,000 USD" in text and "30,000 USD" in text, text
    assert "Do not split it" in text
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        scoped = await client.call_tool("procure__place_order", order(), meta=key())
    assert structured(scoped)["reason"] == "route_not_allowed"
    assert used(await balances(http, admin, tenant)) == before
    assert (await tool_stats(tools_http, tenant))["calls"] == 0


async def test_escalation_waits_then_one_approval_makes_exactly_one_call(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("escalate")
    meta = key()
    deletion = {"owner": "acme", "repo": "legacy"}
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        pending = await client.call_tool("github__delete_repository", deletion, meta=meta)
        assert pending.is_error
        assert structured(pending)["status"] == "escalated"
        escalation = structured(pending)["escalation"]
        assert "approval" in text_of(pending.content[0])
        # Polling by repeating the call does nothing upstream.
        again = await client.call_tool("github__delete_repository", deletion, meta=meta)
        assert structured(again)["escalation"] == escalation
        assert (await tool_stats(tools_http, tenant))["calls"] == 0
        # The approver reads which server's tool it is, as the policy's route names it.
        queue = await http.get(
            f"/v1/admin/tenants/{tenant.id}/escalations", headers=tenant.admin_auth
        )
        assert [e["target"] for e in queue.json()["escalations"]] == [
            "CALL github/delete_repository"
        ]
        approvals = [
            http.post(f"/v1/escalations/{escalation}/approve", headers=tenant.admin_auth)
            for _ in range(4)
        ]
        statuses = sorted(r.status_code for r in await asyncio.gather(*approvals))
        assert statuses == [200, 409, 409, 409]
        done = await client.call_tool("github__delete_repository", deletion, meta=meta)
    assert not done.is_error, done
    assert structured(done)["repo"] == "legacy"
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls"] == 1 and stats["effects"] == 1


async def test_a_rejected_escalation_returns_the_reason_and_never_calls(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("escalate")
    before = (await tool_stats(tools_http, tenant))["calls"]
    meta = key()
    deletion = {"owner": "acme", "repo": "keep-me"}
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        pending = await client.call_tool("github__delete_repository", deletion, meta=meta)
        escalation = structured(pending)["escalation"]
        response = await http.post(
            f"/v1/escalations/{escalation}/reject", headers=tenant.admin_auth
        )
        assert response.status_code == 200, response.text
        after = await client.call_tool("github__delete_repository", deletion, meta=meta)
    assert after.is_error
    assert structured(after)["reason"] == "escalation_rejected"
    assert (await tool_stats(tools_http, tenant))["calls"] == before


async def test_is_error_voids_only_where_the_route_says_not_executed(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("basics")
    admin = mcp_gateway.gateway.admin
    async with agent(mcp_gateway.url, tenant.auth("buyer-02")) as client:
        rejected = await client.call_tool("procure__reject_order", order(), meta=key())
        flaky = await client.call_tool("procure__flaky_order", order(), meta=key())
    assert rejected.is_error and flaky.is_error
    states = {}
    for name, result in (("rejected", rejected), ("flaky", flaky)):
        assert result.meta is not None
        response = await http.get(
            f"/v1/holds/{result.meta['dev.irrev/hold']}",
            params={"tenant": tenant.id},
            headers=admin,
        )
        states[name] = response.json()["state"]
    assert states == {"rejected": "voided", "flaky": "ambiguous"}
    assert "stays charged until reconciled" in text_of(flaky.content[-1])


async def test_one_key_with_other_arguments_is_a_conflict_and_changes_nothing(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("basics")
    meta = key()
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        first = await client.call_tool("procure__place_order", order(quantity=3), meta=meta)
        other = await client.call_tool("procure__place_order", order(quantity=300), meta=meta)
    assert not first.is_error
    assert other.is_error
    assert structured(other)["reason"] == "idempotency_conflict"
    assert first.meta is not None
    calls = (await tool_stats(tools_http, tenant))["calls_by_key"]
    assert calls[f"irrev-{first.meta['dev.irrev/hold']}"] == 1
