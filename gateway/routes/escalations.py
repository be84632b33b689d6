"""Escalations: the agent polls, a human approves or rejects. Approval is a
consume-once claim in the ledger, and only its winner forwards the effect."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from gateway.edge import tracing
from gateway.edge.auth import AdminIdentity, Caller, caller_auth, tenant_admin_auth
from gateway.edge.bodies import Ruling, body_schema, ruling_of
from gateway.edge.problems import Problem
from gateway.edge.responses import (
    answer_response,
    decided_headers,
    parse_escalation_id,
    stored_response,
)
from gateway.edge.wire import StoredAnswer, StoredRequest, owner_of, record_of
from gateway.pipeline import approve as approval
from gateway.pipeline.approve import rejected_problem, resolved, resolved_already
from gateway.pipeline.prepare import Gate
from ledger import HoldState, HoldStateConflict
from pricing import AdminRole

router = APIRouter(prefix="/v1/escalations", tags=["escalations"])


def no_such_escalation() -> Problem:
    return Problem(404, "not_found", "no such escalation")


@router.get("/{escalation}")
async def poll(
    request: Request, escalation: str, caller: Annotated[Caller, Depends(caller_auth)]
) -> Response:
    """202 while a human decides or the effect is being forwarded; then the upstream's
    answer, as the agent would have had it without the escalation."""
    tenant, hold_id = parse_escalation_id(escalation)
    hold = await Gate.of(request).ledger.hold(tenant, hold_id)
    if hold is None or not caller.may_see(tenant, owner_of(hold.request, hold.outcome)):
        raise Problem(404, "not_found", "no such escalation")
    extra = {
        "X-Irrev-Hold": hold_id,
        "X-Irrev-Escalation": hold.state.value,
        **decided_headers(hold.by, hold.note),
    }
    if hold.outcome:
        return stored_response(StoredAnswer.loads(hold.outcome), extra)
    if hold.state in (HoldState.ESCALATED, HoldState.PENDING):
        status = "escalated" if hold.state is HoldState.ESCALATED else "approved"
        body = {
            "status": status,
            "escalation": escalation,
            "by": hold.by or None,
            "note": hold.note or None,
        }
        return JSONResponse(body, 202, headers={**extra, "Retry-After": "2"})
    if hold.state is HoldState.AMBIGUOUS:
        # A call held alone (no key, `dedupe_window: 0`) is not reached by repeating
        # it: its repeat would be a second escalation, and a second effect.
        asked = record_of(hold.request, "")
        alone = isinstance(asked, StoredRequest) and asked.alone
        raise Problem(
            502,
            "upstream_ambiguous",
            "approved, but the effect's outcome is unknown; it stays charged until reconciled",
            hold=hold_id,
        ).reached_again(not alone)
    if hold.state is HoldState.REJECTED:
        raise rejected_problem(hold.by, hold.note, hold_id)
    raise Problem(
        403, "escalation_expired", "nobody approved this effect in time", state=hold.state.value
    )


# The reason is read by hand, after the role check (bodies.ruling_of); the schema
# still tells clients what they may send.
RULING_BODY = body_schema(Ruling, required=False)


@router.post("/{escalation}/approve", openapi_extra=RULING_BODY)
async def approve(
    request: Request,
    escalation: str,
    who: Annotated[AdminIdentity, Depends(tenant_admin_auth)],
) -> Response:
    """Exactly one of any number of concurrent approvals wins and forwards the effect;
    the others get 409 naming the outcome and who decided it."""
    gate = Gate.of(request)
    tenant, hold_id = parse_escalation_id(escalation)
    who.require(tenant, AdminRole.APPROVER, no_such_escalation)
    policy = gate.tenants.policies.get(tenant)
    if policy is None:
        raise no_such_escalation()
    note = (await ruling_of(request, gate.settings)).reason
    answer = await approval.approve(gate, policy, hold_id, who.name, note)
    if answer is None:
        # Decision-only: the in-process tool sees the hold pending and acts itself.
        body = {"status": "approved", "escalation": escalation, "by": who.name, "note": note}
        return JSONResponse(body)
    return answer_response(answer, {"X-Irrev-Hold": hold_id, "X-Irrev-Escalation": "approved"})


@router.post("/{escalation}/reject", openapi_extra=RULING_BODY)
async def reject(
    request: Request,
    escalation: str,
    who: Annotated[AdminIdentity, Depends(tenant_admin_auth)],
) -> dict[str, Any]:
    gate = Gate.of(request)
    tenant, hold_id = parse_escalation_id(escalation)
    who.require(tenant, AdminRole.APPROVER, no_such_escalation)
    admin = who.name
    note = (await ruling_of(request, gate.settings)).reason
    if tenant not in gate.tenants.policies:
        raise no_such_escalation()
    # Read first: a rejected hold keeps no request, and the log line names what it was.
    hold = await gate.ledger.hold(tenant, hold_id)
    stored = StoredRequest.loads(hold.request) if hold and hold.request else None
    with tracing.span("approval", tenant=tenant, hold_id=hold_id, admin=admin) as span:
        try:
            await gate.ledger.reject(tenant, hold_id, admin, note=note)
        except HoldStateConflict as exc:
            tracing.annotate(span, decision="conflict", state=exc.state.value)
            raise resolved_already(exc) from exc
        tracing.annotate(span, decision="rejected")
    resolved(tenant, admin, "rejected", hold_id, stored, note)
    return {"status": "rejected", "escalation": escalation, "by": admin, "note": note}
