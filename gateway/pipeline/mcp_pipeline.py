"""An MCP tool call through the admission pipeline (gateway/pipeline/: prepare ->
reserve -> deliver once through the tenant's MCP server -> settle), and what came of
it, for the endpoint to shape into a tool result."""

from __future__ import annotations

from dataclasses import dataclass

import mcp_types as types
from pydantic import ValidationError

from gateway.edge.canonical import Canonical
from gateway.edge.problems import Problem, kept_problem
from gateway.edge.wire import (
    BODY_OMITTED,
    BODY_OMITTED_REASON,
    BODY_SHA256,
    OVER_ALLOWANCE,
    StoredAnswer,
)
from gateway.pipeline.decision import Decision, admit
from gateway.pipeline.prepare import (
    KEYLESS_ARGUMENTS,
    Gate,
    Intent,
    check_active,
    prepare,
    upstream_of,
)
from gateway.pipeline.upstream import Answer, Fate
from gateway.state.mcp_upstream import MCP_KEY
from ledger import HoldState
from pricing import AuthenticatedAgent, TenantPolicy, call_route


@dataclass(frozen=True)
class Outcome:
    """What became of a call: its `decision` (None for a read, which holds nothing),
    and what its answer means for the agent: a tool result (its fate, and the result
    itself), or a problem (the effect was not made, or its outcome is unknown and no
    result came). An escalated call has neither while a person decides."""

    decision: Decision | None = None
    fate: Fate = Fate.DELIVERED
    tool_result: types.CallToolResult | None = None
    problem: Problem | None = None
    # How long an escalated call waited for the person's decision.
    waited_s: float = 0.0

    @property
    def escalated(self) -> bool:
        return self.decision is not None and self.decision.escalated


def outcome_of(decision: Decision) -> Outcome:
    """A tool result (live, or recorded with the settled hold) is passed on; anything
    else becomes the problem it means for the agent."""
    answer, hold_id = decision.answer, decision.hold_id
    if answer is None:
        return Outcome(decision)
    if isinstance(answer, StoredAnswer):
        return Outcome(decision, *_recorded(answer, hold_id, decision.state))
    return Outcome(decision, *_live(answer, hold_id))


def _live(answer: Answer, hold_id: str) -> tuple[Fate, types.CallToolResult | None, Problem | None]:
    """An answer the MCP server gave now: its result, or the problem its fate is."""
    if answer.fate is Fate.NOT_SENT:
        return answer.fate, None, _unreachable(hold_id, answer.why)
    result = _result_of(answer.parsed, answer.payload)
    if result is not None:
        return answer.fate, result, None
    if answer.fate is Fate.REFUSED:
        problem = Problem(
            422,
            "bad_request",
            f"the MCP server refused the call before running it ({answer.why}); "
            "nothing was done and the hold was released",
            hold=hold_id or None,
        )
        return answer.fate, None, problem
    problem = Problem(
        502,
        "upstream_ambiguous",
        "the call may or may not have taken effect; it stays charged until reconciled",
        why=answer.why,
        hold=hold_id or None,
    )
    return answer.fate, None, problem


def _recorded(
    answer: StoredAnswer, hold_id: str, state: HoldState
) -> tuple[Fate, types.CallToolResult | None, Problem | None]:
    """An answer kept with the settled hold, read by the hold's fate: a result whose
    call was made (posted), or that says itself it was not (`isError`, the route's
    "not executed"), is passed on; a voided hold with no such result was never made
    (the server refused the call, or the reconciler learnt it never happened)."""
    if answer.reason:
        # The gateway's own refusal, kept for repeats (nothing was sent): as it was.
        return Fate.REFUSED, None, _kept_problem(answer, hold_id)
    posted = state is not HoldState.VOIDED
    notes = answer.omitted()
    if notes and posted:
        # Made, and its result not kept: said so, never "unreachable", which would
        # tell the model that nothing was made and invite a second effect.
        return Fate.DELIVERED, _not_kept(notes), None
    result = _result_of(None, answer.body)
    if result is not None and (posted or result.is_error):
        return (Fate.DELIVERED if posted else Fate.REFUSED), result, None
    if not posted:
        return Fate.REFUSED, None, _voided(hold_id)
    return Fate.NOT_SENT, None, _unreachable(hold_id)


def _result_of(parsed: object, payload: bytes) -> types.CallToolResult | None:
    """The payload as a tool result (as the upstream's client parsed it, if it did);
    None for anything else (a JSON-RPC error, nothing)."""
    if isinstance(parsed, types.CallToolResult):
        return parsed
    try:
        return types.CallToolResult.model_validate_json(payload)
    except ValidationError:
        return None


def _not_kept(notes: dict[str, str]) -> types.CallToolResult:
    """The result of a call made before whose result was kept without its body
    (wire.BODY_NOTES): what the model can act on, and the digest to check a copy by."""
    why = (
        "the agent's allowance of kept answers for today was used up"
        if notes[BODY_OMITTED_REASON] == OVER_ALLOWANCE
        else "it was too large to keep"
    )
    text = (
        "This call was already made, and it is not made again. Its result "
        f"({notes[BODY_OMITTED]} bytes, SHA-256 {notes[BODY_SHA256]}) was not kept because "
        f"{why}, so this repeat cannot show it. Do not call it again to see the result: "
        "use the first call's result if you have it, or look the outcome up with the "
        "tool's own read operations."
    )
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _kept_problem(answer: StoredAnswer, hold_id: str) -> Problem:
    """A refusal kept with its hold, with its reason and its detail (worded for the
    caller's transport when it was made), read as every repeat reads it
    (`kept_problem`), naming its hold (an HTTP answer does in a header)."""
    kept = kept_problem(answer.status, answer.reason, answer.body)
    return Problem(kept.status, kept.reason, kept.detail, hold=hold_id)


def _voided(hold_id: str) -> Problem:
    return Problem(
        409,
        "hold_voided",
        "this call's hold was voided, so it was not made; use a new idempotency key to make it",
        hold=hold_id,
    )


def _unreachable(hold_id: str, why: str = "") -> Problem:
    return Problem(
        502,
        "upstream_unreachable",
        "the MCP server could not be reached; nothing was sent and the hold was released",
        why=why or None,
        hold=hold_id or None,
    )


async def call_effect(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    server: str,
    tool: str,
    canonical: Canonical,
    key: str,
    *,
    by_content: bool = False,
) -> Outcome:
    """One `tools/call` through the admission pipeline, with the tenant's MCP server
    `server` as its Upstream; refusals are raised (Problem, RequestError). `key`: the
    agent's own idempotency key, '' when it sent none (most hosts): the call is then
    keyed by its content, as its route says (prepare.keyed_by_content).
    `by_content`: `key` is the content key a keyless call is held under, asked again
    on that call's behalf (while it waits for a person's decision): its answers are
    worded for the keyless call it is, never asking for a key its host cannot send."""
    check_active(agent)  # before the server is looked up, as prepare does before pricing
    if server not in policy.catalog.mcp_tools:
        # An HTTP tool of the tenant would be sent a call with the agent's name as
        # its path, and charged: /mcp reaches MCP servers only.
        raise Problem(403, "unknown_route", f"{server!r} is not an MCP server of this tenant")
    operation, target = call_route(server, tool)
    intent = Intent(
        tool=server,
        operation=operation,
        target=target,
        canonical=canonical,
        keys=(key,) if key else (),
        key_name=KEYLESS_ARGUMENTS if by_content else MCP_KEY,
        keyless_name=KEYLESS_ARGUMENTS,
    )
    prepared = prepare(policy, agent, intent, in_process=False)
    try:
        decision = await admit(gate, policy, agent, prepared, upstream_of(gate, policy, server))
    except Problem as problem:
        if by_content:
            # As a keyless call's own refusals name its key (decision.admit).
            problem.extra.setdefault("idempotency_key", key)
        raise
    if isinstance(decision, Answer):  # a read: free, nothing held
        return Outcome(None, *_live(decision, ""))
    return outcome_of(decision)
