"""An MCP tool call through the admission pipeline: price -> reserve -> deliver once
through the tenant's MCP server -> settle, and what came of it for the endpoint to
shape into a tool result."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass

from ledger.records import Decision, HoldState
from pricing import EffectClass, TenantPolicy, check_per_effect_cap, price_request
from pricing.credentials import AuthenticatedAgent
from pricing.policy import BodyFormat
from pricing.scopes import check_route_scope

from .admission import Gate, fire, refusal, reserve, settled_problem
from .canonical import Canonical
from .mcp_upstream import McpUpstream
from .problems import Problem
from .upstream import Answer, Fate
from .wire import StoredAnswer, StoredRequest, fingerprint, hold_id_for

CALL = "CALL"


@dataclass(frozen=True)
class Outcome:
    """What became of a call: escalated (a human decides), an answer (fate and body:
    the CallToolResult as JSON), or a problem (the effect was not made, or its
    outcome is unknown and no result came)."""

    hold_id: str = ""
    price: int = 0
    escalated: bool = False
    fate: Fate = Fate.DELIVERED
    body: bytes = b""
    problem: Problem | None = None


def outcome_of(answer: Answer | StoredAnswer, hold_id: str, price: int) -> Outcome:
    if isinstance(answer, StoredAnswer):
        if answer.status // 100 == 2 or answer.status == 422:
            fate = Fate.DELIVERED if answer.status // 100 == 2 else Fate.REFUSED
            return Outcome(hold_id, price, fate=fate, body=answer.body)
        if answer.status == 502:
            return Outcome(hold_id, price, problem=_unreachable(hold_id))
        # Voided by the reconciler (the server says it never happened) or an admin.
        voided = Problem(
            409,
            "hold_voided",
            "this call's hold was voided, so it was not made; use a new idempotency key "
            "to make it",
            hold=hold_id,
        )
        return Outcome(hold_id, price, problem=voided)
    if answer.fate is Fate.NOT_SENT:
        return Outcome(hold_id, price, problem=_unreachable(hold_id))
    if answer.body and answer.status != 400 and answer.status != 502:
        return Outcome(hold_id, price, fate=answer.fate, body=answer.body)
    if answer.fate is Fate.REFUSED:
        return Outcome(
            hold_id,
            price,
            problem=Problem(
                422,
                "bad_request",
                f"the MCP server refused the call before running it ({answer.why}); "
                "nothing was done and the hold was released",
                hold=hold_id or None,
            ),
        )
    return Outcome(
        hold_id,
        price,
        problem=Problem(
            502,
            "upstream_ambiguous",
            "the call may or may not have taken effect; it stays charged until reconciled. "
            "Repeat it with the same idempotency key: the server can deduplicate it",
            why=answer.why,
            hold=hold_id or None,
        ),
    )


def _unreachable(hold_id: str) -> Problem:
    return Problem(
        502,
        "upstream_unreachable",
        "the MCP server could not be reached; nothing was sent and the hold was released",
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
    path = f"/{tool}"
    effect = price_request(policy, server, CALL, path, {}, canonical.document, BodyFormat.JSON)
    check_route_scope(policy, agent, effect)
    check_per_effect_cap(agent, effect)
    upstream = gate.tenants.mcp_upstream(policy.tenant, server)
    if upstream is None:
        raise Problem(403, "no_upstream", f"tool {server!r} is not an MCP server")
    body = canonical.body
    request = StoredRequest(
        agent.agent_id,
        server,
        CALL,
        path,
        "",
        canonical.content_type,
        base64.b64encode(body).decode(),
        effect.route_id,
        effect.price_micros,
        face_value=effect.face_value_micros,
        effect_class=effect.effect_class.value,
    )
    if effect.effect_class is EffectClass.READ:
        return outcome_of(await _read(gate, upstream, request), "", 0)
    hold_id = hold_id_for(policy.tenant, agent.agent_id, effect.route_id, key)
    digest = fingerprint(CALL, path, "", body)
    result = await reserve(gate, policy, agent, effect, hold_id, digest, request)
    if result.decision is Decision.DENY:
        raise refusal(result, hold_id)
    if result.state is HoldState.ESCALATED:
        return Outcome(hold_id, result.price, escalated=True)
    if not result.replayed:
        answer = await fire(gate, policy, hold_id, request, result.deadline_ms)
        return outcome_of(answer, hold_id, result.price)
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is not None and hold.outcome:
        return outcome_of(StoredAnswer.loads(hold.outcome), hold_id, result.price)
    if hold is not None and hold.state is HoldState.AMBIGUOUS:
        answer = await fire(gate, policy, hold_id, StoredRequest.loads(hold.request), None)
        return outcome_of(answer, hold_id, result.price)
    raise settled_problem(hold.state if hold else result.state, hold_id)


async def _read(gate: Gate, upstream: McpUpstream, request: StoredRequest) -> Answer:
    return await upstream.deliver(request, "", time.monotonic() + gate.settings.upstream_timeout_s)
