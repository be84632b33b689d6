"""A suspended agent over MCP (docs/operations.md, "Stop an agent"): its tools/call
is answered with a tool result the model can act on (isError, who suspended it and
why, that repeating will not help, `structuredContent.reason` agent_suspended), and
once resumed its calls are made again. The gateway's two workers each apply the
change within their refresh: every wait polls until a deadline, never sleeps."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import httpx
import mcp_types as types
import pytest

from .conftest import McpGateway, agent, key, order, structured, text_of

pytestmark = pytest.mark.asyncio(loop_scope="session")

REASON = "places orders in a loop: stopped while we look"
DEADLINE_S = 60.0  # a bound, not a delay


async def until_reason(
    call: Callable[[], Awaitable[types.CallToolResult]], done: Callable[[str], bool]
) -> types.CallToolResult:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = await call()
        reason = str((result.structured_content or {}).get("reason", "")) if result.is_error else ""
        if done(reason):
            return result
        assert time.monotonic() < deadline, f"still answered {result}"


async def test_a_suspended_agent_gets_a_tool_result_saying_so_until_resumed(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("suspend")
    admin = mcp_gateway.gateway.admin
    agents = f"/v1/admin/tenants/{tenant.id}/agents/buyer-01"
    suspended = await http.post(f"{agents}/suspend", json={"reason": REASON}, headers=admin)
    assert suspended.status_code == 200, suspended.text
    meta = key()
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        # The same key every try: a worker that had not applied it yet made the order
        # at most once, and each repeat is refused once suspended there.
        result = await until_reason(
            lambda: client.call_tool("procure__place_order", order(), meta=meta),
            lambda reason: reason == "agent_suspended",
        )
        assert result.is_error
        text = text_of(result.content[0])
        assert text.startswith("irrev did not make this call: an operator (operator:ops)")
        assert REASON in text and "will not help" in text
        fields = structured(result)
        assert (fields["status"], fields["retry"]) == (403, "no")
        assert fields["suspension_reason"] == REASON
        resumed = await http.post(f"{agents}/resume", headers=admin)
        assert resumed.status_code == 200, resumed.text
        fresh = key()
        made = await until_reason(
            lambda: client.call_tool("procure__place_order", order(), meta=fresh),
            lambda reason: reason != "agent_suspended",
        )
    assert not made.is_error, made
