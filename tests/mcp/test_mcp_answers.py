"""What a JSON-RPC error from an MCP server says about the effect. Only "method not
found" proves the tool did not run: SDK servers answer "invalid params" and "invalid
request" also after the tool ran, when its output fails the tool's output schema (the
TypeScript SDK's McpServer does), so those must keep the hold charged, not release it."""

from __future__ import annotations

import hashlib

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.edge.wire import StoredAnswer
from gateway.pipeline.mcp_pipeline import _recorded
from gateway.pipeline.upstream import Fate
from gateway.state.mcp_upstream import failure_answer
from ledger import HoldState


def test_method_not_found_releases_the_hold() -> None:
    answer = failure_answer(MCPError(types.METHOD_NOT_FOUND, "no such tool"))
    assert answer.fate is Fate.REFUSED


@pytest.mark.parametrize("code", [types.INVALID_PARAMS, types.INVALID_REQUEST])
def test_an_error_the_server_can_send_after_running_stays_charged(code: int) -> None:
    answer = failure_answer(MCPError(code, "Output validation error: result does not match"))
    assert answer.fate is Fate.UNKNOWN
    assert answer.why == f"mcp_{code}"


def test_a_repeat_of_a_result_kept_without_its_body_says_it_was_made() -> None:
    """A posted call whose result was kept without its body (over 256 KiB, or past the
    agent's kept_answer_bytes of the day) was answered upstream_unreachable on a
    repeat: "nothing was sent", which invites the model to make it a second time."""
    result = b'{"content":[{"type":"text","text":"' + b"x" * 2000 + b'"}]}'
    whole = StoredAnswer.of("a1", 200, [("content-type", "application/json")], result)
    short = whole.without_body()
    assert short is not None
    fate, told, problem = _recorded(short, "h1", HoldState.POSTED)
    assert fate is Fate.DELIVERED and problem is None and told is not None
    assert not told.is_error
    text = told.content[0].text  # type: ignore[union-attr]
    assert "already made, and it is not made again" in text
    assert f"({len(result)} bytes, SHA-256 {hashlib.sha256(result).hexdigest()})" in text
    assert "allowance of kept answers for today was used up" in text
    # Voided, it was never made: the model may make it anew.
    fate, told, problem = _recorded(short, "h1", HoldState.VOIDED)
    assert fate is Fate.REFUSED and problem is not None and problem.reason == "hold_voided"
