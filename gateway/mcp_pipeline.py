"""An MCP tool call through the admission pipeline (gateway/admission.py: prepare ->
reserve -> deliver once through the tenant's MCP server -> settle), and what came of
it, for the endpoint to shape into a tool result."""

from __future__ import annotations

from dataclasses import dataclass, replace

import mcp_types as types

from ledger import ReserveResult
from pricing import AuthenticatedAgent, TenantPolicy

from .admission import KEYLESS_ARGUMENTS, Gate, Intent, admit, prepare, upstream_of
from .canonical import Canonical
from .mcp_upstream import CALL_REFUSED, MCP_KEY, NOT_EXECUTED, RESULT
from .problems import Problem, kept_problem
from .upstream import Answer, Fate
from .wire import StoredAnswer

CALL = "CALL"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of a call: escalated (a human decides), an answer (fate and body:
    the CallToolResult as JSON), or a problem (the effect was not made, or its
    outcome is unknown and no result came)."""

    hold_id: str = ""
    price: int = 0
    escalated: bool = False
    fate: Fate = Fate.DELIVERED
    body: bytes = b""
    tool_result: types.CallToolResult | None = None  # the body, parsed (a live answer)
    problem: Problem | None = None
    key: str = ""  # the key it is held under: the agent's, or derived from its content
    replayed: bool = False  # the answer of an earlier, identical call
    # An escalation: its reserve (what tripped), how long its route lets the call wait
    # for the decision, and how long it did.
    result: ReserveResult | None = None
    wait_s: float = 0.0
    waited_s: float = 0.0
    # Who approved it and why, once decided (a repeat of an approved call's key).
    by: str = ""
    note: str = ""


def outcome_of(answer: Answer | StoredAnswer, hold_id: str, price: int) -> Outcome:
    """A tool result (live, or recorded with the settled hold) is passed on; anything
    else becomes the problem it means for the agent."""
    if isinstance(answer, StoredAnswer):
        if answer.reason:
            # The gateway's own refusal, kept for repeats (nothing was sent): as it was.
            return Outcome(hold_id=hold_id, price=price, problem=_kept_problem(answer, hold_id))
        if answer.status in (RESULT, NOT_EXECUTED):
            fate = Fate.DELIVERED if answer.status == RESULT else Fate.REFUSED
            return Outcome(hold_id=hold_id, price=price, fate=fate, body=answer.body)
        if answer.status == 404 or answer.status == CALL_REFUSED:
            # Voided: the reconciler learnt it never happened, or the server refused it.
            return Outcome(hold_id=hold_id, price=price, problem=_voided(hold_id))
        return Outcome(hold_id=hold_id, price=price, problem=_unreachable(hold_id))
    if answer.fate is Fate.NOT_SENT:
        return Outcome(hold_id=hold_id, price=price, problem=_unreachable(hold_id, answer.why))
    if answer.status in (RESULT, NOT_EXECUTED):
        parsed = answer.parsed if isinstance(answer.parsed, types.CallToolResult) else None
        return Outcome(
            hold_id=hold_id, price=price, fate=answer.fate, body=answer.body, tool_result=parsed
        )
    if answer.fate is Fate.REFUSED:
        return Outcome(
            hold_id=hold_id,
            price=price,
            problem=Problem(
                422,
                "bad_request",
                f"the MCP server refused the call before running it ({answer.why}); "
                "nothing was done and the hold was released",
                hold=hold_id or None,
            ),
        )
    return Outcome(
        hold_id=hold_id,
        price=price,
        problem=Problem(
            502,
            "upstream_ambiguous",
            "the call may or may not have taken effect; it stays charged until reconciled",
            why=answer.why,
            hold=hold_id or None,
        ),
    )


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
) -> Outcome:
    """One `tools/call` through the admission pipeline, with the tenant's MCP server
    `server` as its Upstream; refusals are raised (Problem, RequestError). `key`: the
    agent's own idempotency key, '' when it sent none (most hosts): the call is then
    keyed by its content, as its route says (admission.keyed_by_content)."""
    if server not in policy.catalog.mcp_tools:
        # An HTTP tool of the tenant would be sent method CALL with the agent's name
        # as its path, and charged: /mcp reaches MCP servers only.
        raise Problem(403, "unknown_route", f"{server!r} is not an MCP server of this tenant")
    keys = (key,) if key else ()
    intent = Intent(
        tool=server,
        method=CALL,
        path=f"/{tool}",
        canonical=canonical,
        keys=keys,
        key_name=MCP_KEY,
        keyless_name=KEYLESS_ARGUMENTS,
    )
    prepared = prepare(policy, agent, intent, in_process=False)
    admitted = await admit(gate, policy, agent, prepared, upstream_of(gate, policy, server))
    if isinstance(admitted, Answer):
        return outcome_of(admitted, "", 0)  # a read: free, nothing held
    price, held = admitted.result.price, admitted.key
    replayed = admitted.result.replayed
    if admitted.answer is None:
        route = prepared.effect.route
        return Outcome(
            hold_id=admitted.hold_id,
            price=price,
            escalated=True,
            key=held,
            replayed=replayed,
            result=admitted.result,
            wait_s=route.escalation_wait_ms / 1000 if route else 0.0,
        )
    outcome = outcome_of(admitted.answer, admitted.hold_id, price)
    return replace(outcome, key=held, replayed=replayed, by=admitted.by, note=admitted.note)
