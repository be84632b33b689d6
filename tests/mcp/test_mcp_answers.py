"""What a JSON-RPC error from an MCP server says about the effect. Only "method not
found" proves the tool did not run: SDK servers answer "invalid params" and "invalid
request" also after the tool ran, when its output fails the tool's output schema (the
TypeScript SDK's McpServer does), so those must keep the hold charged, not release it."""

from __future__ import annotations

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.pipeline.upstream import Fate
from gateway.state.mcp_upstream import failure_answer


def test_method_not_found_releases_the_hold() -> None:
    answer = failure_answer(MCPError(types.METHOD_NOT_FOUND, "no such tool"))
    assert answer.fate is Fate.REFUSED


@pytest.mark.parametrize("code", [types.INVALID_PARAMS, types.INVALID_REQUEST])
def test_an_error_the_server_can_send_after_running_stays_charged(code: int) -> None:
    answer = failure_answer(MCPError(code, "Output validation error: result does not match"))
    assert answer.fate is Fate.UNKNOWN
    assert answer.why == f"mcp_{code}"
