"""What a `tools/call` through irrev answers as MCP content (gateway/routes/mcp_server.py
serves it): the tool's result with irrev's `_meta` and notes a model reads, a pending
result naming the escalation, or a refusal; each saying how to learn more in the
words of how the call is held: the agent's own key, its arguments (a host that sends
no key), or neither (no key, on a route whose identical calls are each a new effect),
where nothing the host sends reaches the call again."""

from __future__ import annotations

from enum import Enum
from typing import Any

import mcp_types as types
from starlette.responses import JSONResponse

from gateway.edge.advice import (
    UNREPEATABLE,
    Retry,
    approval,
    escalation_sentence,
    next_step,
    told,
    units_of,
)
from gateway.edge.problems import Problem
from gateway.edge.responses import escalation_id
from gateway.pipeline.decision import Decision
from gateway.pipeline.mcp_pipeline import Outcome
from gateway.pipeline.prepare import KEYLESS_KEY_PREFIX
from gateway.pipeline.upstream import Fate
from gateway.state.mcp_upstream import HOLD_META, KEY_META
from pricing import TenantPolicy

# Who approved an escalated call and why, in a result's _meta (irrev's prefix).
DECIDED_BY_META = "dev.irrev/decided_by"
NOTE_META = "dev.irrev/note"
PRICE_META = "dev.irrev/price"
# The route's burst detector: 'on' or 'margin' (gateway/pipeline/decision.py), and
# the price a margin's hold falls to once the detector vouches for it.
STRESS_META = "dev.irrev/stress"
CALM_PRICE_META = "dev.irrev/calm_price"


class Held(Enum):
    """How a call is held, which decides how its model may ask about it again."""

    BY_KEY = "key"  # under the key the agent sent: the same key
    BY_CONTENT = "content"  # no key sent, keyed by its arguments: the identical call
    ALONE = "alone"  # no key sent, `dedupe_window: 0`: an identical call is a new effect


def held(sent: str, key: str) -> Held:
    """How a call whose agent sent `sent` ('' for none) is held under `key`."""
    if sent:
        return Held.BY_KEY
    return Held.ALONE if key.startswith(KEYLESS_KEY_PREFIX) else Held.BY_CONTENT


def refused(problem: Problem, key: str, how: Held = Held.BY_KEY) -> types.CallToolResult:
    """A refusal the model can act on: what happened and what to do (the problem's
    text, gateway/edge/advice.py), and the problem's fields as structured content."""
    repeatable = how is not Held.ALONE
    retry = next_step(problem.reason, repeatable)[0]
    text = told(problem.detail, problem.reason, repeatable)
    structured = {
        "reason": problem.reason,
        "status": problem.status,
        "detail": text,
        "retry": retry.value,
    }
    structured |= {
        k: v for k, v in problem.extra.items() if isinstance(v, str | int | float | None)
    }
    if key:
        structured["idempotency_key"] = key
    # An ambiguous or in-flight call may have happened: "not made" would be false.
    if next_step(problem.reason)[0] is Retry.SAME_CALL:
        said = "irrev cannot tell yet whether this call took effect"
    else:
        said = "irrev did not make this call"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{said}: {text}")],
        structured_content=structured,
        is_error=True,
    )


def rpc_refusal(problem: Problem) -> JSONResponse:
    """A refusal made before the SDK reads the POST (its body, its JSON, the agent's
    requests in flight), in its HTTP status, as its MCP client reads it. Streamable
    HTTP answers input a server cannot accept with an HTTP error whose body may be a
    JSON-RPC error with no id; the official SDK's client surfaces such a body
    (application/json) as the error its host sees, but turns problem+json into
    "Server returned an error response", losing the sentence. The problem document's
    members stay beside the error's, for programs that read them."""
    code = types.PARSE_ERROR if problem.reason == "bad_json" else types.INVALID_REQUEST
    data = {
        "reason": problem.reason,
        "status": problem.status,
        "retry": next_step(problem.reason)[0].value,
    }
    error = {"code": code, "message": f"irrev did not make this call: {problem.text}", "data": data}
    body = {**problem.document(), "jsonrpc": "2.0", "id": None, "error": error}
    return JSONResponse(body, problem.status, headers=problem.response_headers())


def again(how: Held, key: str) -> str:
    """How the model asks again about a call it can reach again (not Held.ALONE), to
    finish a sentence: the same arguments if the call was keyed by them (its host sends
    no key), else the key it sent."""
    if how is Held.BY_KEY:
        return f"make the same call again with _meta {{{KEY_META!r}: {key!r}}}"
    return "make the identical call again (the same arguments; it is not made twice)"


def answered(outcome: Outcome, policy: TenantPolicy, sent: str) -> types.CallToolResult:
    """The decision and what came of it as MCP content: the tool's result with irrev's
    `_meta` (hold, price, key, who approved it) and notes a model reads; a pending
    result naming the escalation; or the refusal its problem is. `sent`: the agent's
    own key, '' if it sent none."""
    decision = outcome.decision
    key = decision.key if decision is not None and decision.key else sent
    how = held(sent, key)
    meta: dict[str, Any] = {KEY_META: key}
    if decision is not None and decision.hold_id:
        meta |= {HOLD_META: decision.hold_id, PRICE_META: decision.price}
    if decision is not None and decision.stress:
        meta |= {STRESS_META: decision.stress, CALM_PRICE_META: decision.calm_price or None}
    if decision is not None and decision.by:
        meta |= {DECIDED_BY_META: decision.by, NOTE_META: decision.note or None}
    if decision is not None and outcome.escalated:
        return _escalated(decision, policy, key, how, meta, outcome.waited_s)
    if outcome.problem is not None:
        return refused(outcome.problem, key, how)
    assert outcome.tool_result is not None
    notes: list[str] = []
    if decision is not None and decision.by:
        notes.append(approval(decision.by, decision.note))
    if decision is not None and decision.replayed:
        notes.append(
            "irrev: this is the result of an earlier identical call; it was not made again."
        )
    if outcome.fate is Fate.UNKNOWN:
        notes.append(_unknown(how, key))
    result = outcome.tool_result
    content = [*result.content, *(types.TextContent(type="text", text=text) for text in notes)]
    merged = {**(result.meta or {}), **meta}
    return result.model_copy(update={"content": content, "meta": merged})


def _unknown(how: Held, key: str) -> str:
    """The note beside a tool's error result, which does not say whether it acted."""
    said = (
        "irrev: the tool reported an error, so whether it acted is unknown; the call "
        "stays charged until reconciled."
    )
    if how is Held.ALONE:
        return f"{said} {UNREPEATABLE[1]}"
    return f"{said} To learn the outcome, {again(how, key)} later; do not make it as a new call."


def _escalated(
    decision: Decision,
    policy: TenantPolicy,
    key: str,
    how: Held,
    meta: dict[str, Any],
    waited_s: float,
) -> types.CallToolResult:
    """A pending result: a person decides; the model learns how to get the result."""
    escalation = escalation_id(policy.tenant, decision.hold_id)
    said = escalation_sentence(units_of(policy), decision.result, escalation)
    if waited_s:
        said += f"; irrev waited {waited_s:g} s for the decision"
    retry = Retry.SAME_CALL
    if how is Held.ALONE:
        # Nothing the host sends reaches this escalation again: a repeat would be a
        # second one, and a second effect once both are approved.
        retry = Retry.NO
        text = (
            f"{said}; if a person approves it, irrev makes it then. An identical call "
            "would be a new one, waiting for a person again, so do not make this call "
            "again to learn the result: check later whether it was made (read what it "
            "changes, or list what exists)."
        )
    else:
        text = f"{said}. To get its result once a person decides, {again(how, key)}."
    structured = {
        "status": "escalated",
        "escalation": escalation,
        "idempotency_key": key,
        "price": decision.price,
        "retry": retry.value,
    }
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )
