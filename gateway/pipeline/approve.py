"""Approve: a person's (or a rule's) consume-once approval of an escalated hold,
which forwards its effect; and what every resolution of an escalation records."""

from __future__ import annotations

import json
import logging
import time

from gateway.edge import metrics, tracing
from gateway.edge.advice import rejection
from gateway.edge.problems import Problem, suspension_members
from gateway.edge.wire import StoredAnswer, StoredRequest
from gateway.pipeline.crashpoints import crash_point
from gateway.pipeline.deliver import fire, require_replicas
from gateway.pipeline.prepare import Gate, upstream_of
from gateway.pipeline.upstream import Answer, Upstream
from gateway.state.http_upstream import HTTP_KEY
from ledger import (
    HoldState,
    HoldStateConflict,
    ReserveResult,
    Rule,
)
from pricing import (
    AuthenticatedAgent,
    TenantPolicy,
)

log = logging.getLogger("irrev.gateway")


async def approve(
    gate: Gate, policy: TenantPolicy, hold_id: str, admin: str, note: str = ""
) -> Answer | None:
    """Consume-once: of any number of concurrent approvals exactly one claims the
    hold and forwards its effect, by the deadline and request the claim returns;
    every other gets 409 naming the outcome and who decided it. None: the route is
    decision-only, and its in-process tool sees the hold pending and acts itself."""
    tenant = policy.tenant
    with tracing.span("approval", tenant=tenant, hold_id=hold_id, admin=admin) as span:
        # Where the effect goes is looked up before the claim: a policy that dropped
        # the tool's upstream meanwhile is refused while the hold is still escalated,
        # not after, when a claimed hold nobody can send would turn ambiguous.
        upstream = await _approval_upstream(gate, policy, hold_id)
        sent = time.monotonic()
        try:
            claim = await gate.ledger.approve(
                tenant, hold_id, admin, ttl_ms=policy.hold_ttl_ms, note=note
            )
        except HoldStateConflict as exc:
            tracing.annotate(span, decision="conflict", state=exc.state.value)
            raise resolved_already(exc) from exc
        crash_point("after_claim")
        request = StoredRequest.loads(claim.request)
        tracing.annotate(span, decision="approved", price=request.price, route=request.route_id)
        resolved(tenant, admin, "approved", hold_id, request, note)
        # Kept for the agent's repeat of its call: worded for where it sends its key.
        key_name = upstream.key_name if upstream is not None else HTTP_KEY
        await require_replicas(
            gate, tenant, hold_id, claim.replicas, request.agent, key_name, claim.fsynced
        )
        if upstream is None:
            return None
        # The claim armed the hold for ttl_ms from its Redis time, after `sent`.
        expires_at = sent + policy.hold_ttl_ms / 1000
        return await fire(gate, policy, hold_id, request, expires_at, upstream)


async def auto_approval(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    result: ReserveResult,
    alone: int = 0,
) -> Rule | None:
    """The live rule, if any, that approves this new escalation without a person: an
    `auto_approve` rule for its agent or its agent's principal whose `max_price` the
    price is within. Rules are read only for escalations, and against the reserve's
    own clock (Redis's), so an expired rule never approves. `alone`: a pooled effect's
    price alone, which `max_price` compares, as the thresholds do (reserve.lua)."""
    if result.replayed:
        return None
    price = max(result.price, alone)
    for rule in await gate.ledger.rules(policy.tenant, result.created_ms):
        spec = json.loads(rule.spec)
        mine = spec.get("agent") == agent.agent_id or spec.get("principal") == agent.principal_id
        if spec.get("kind") == "auto_approve" and mine and price <= spec["max_price"]:
            return rule
    return None


async def _approval_upstream(gate: Gate, policy: TenantPolicy, hold_id: str) -> Upstream | None:
    """The upstream an escalated hold's effect goes to once approved; None for a
    decision-only route (its in-process tool acts itself) and for a hold that is not
    escalated (the claim then says what became of it). Refused while its agent is
    suspended (`_check_active`)."""
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is None or hold.state is not HoldState.ESCALATED or not hold.request:
        return None
    request = StoredRequest.loads(hold.request)
    _check_active(policy, request.agent)
    found = policy.catalog.match(request.tool, request.method, request.path)
    if found is not None and found[0].in_process:
        return None
    return upstream_of(gate, policy, request.tool)


def _check_active(policy: TenantPolicy, agent_id: str) -> None:
    """409 for an escalation of an agent an operator suspended: an operator stops a
    hostile agent, and its escalations waiting in the queue (asked for under whatever
    description it gave) are not carried out by a person who approves one without
    having seen the suspension. Resuming the agent is the deliberate way back."""
    agent = policy.document.agents.get(agent_id)
    suspension = agent.suspended if agent is not None else None
    if suspension is None:
        return
    raise Problem(
        409,
        "agent_suspended_escalation",
        f"agent {agent_id} was suspended by {suspension.by} at {suspension.at}, saying "
        f"{suspension.reason!r}: its escalations are not carried out while it is. Reject "
        f"this one, or resume the agent first (POST .../agents/{agent_id}/resume) if it "
        "should be carried out",
        **suspension_members(suspension),
    )


def resolved(
    tenant: str,
    admin: str,
    decision: str,
    hold_id: str,
    request: StoredRequest | StoredAnswer | None,
    reason: str = "",
) -> None:
    """The counter and the log line of an approval, a rejection or a resolution by
    hand, with the admin's reason (the one the agent and the journal get)."""
    metrics.ADMIN_DECISIONS.labels(tenant, metrics.admin_label(admin), decision).inc()
    log.info(
        f"escalation {decision}",
        extra={
            "tenant": tenant,
            "admin": admin,
            "hold_id": hold_id,
            "agent": request.agent if request else None,
            "route": request.route_id if request else None,
            "price": request.price if isinstance(request, StoredRequest) else None,
            "reason": reason or None,
        },
    )


def resolved_already(conflict: HoldStateConflict) -> Problem:
    """The loser of a consume-once race learns the outcome and who decided it."""
    state = conflict.state.value
    return Problem(409, "escalation_resolved", f"already {state}", state=state, by=conflict.by)


def rejected_problem(by: str, note: str, hold_id: str | None = None) -> Problem:
    """What the agent learns of a rejection: who, and why in their words."""
    return Problem(
        403, "escalation_rejected", rejection(by, note), by=by, note=note or None, hold=hold_id
    )
