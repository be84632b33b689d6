"""The decision-only API for tools that run in-process: authorise, then capture
(post), void or mark ambiguous by id, like a card authorisation or Envoy ext_authz."""

from __future__ import annotations

import base64
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError

from ledger.keys import observed_key
from ledger.records import Decision, Hold, HoldState, Status
from pricing import TenantPolicy, check_per_effect_cap, price_request
from pricing.credentials import AuthenticatedAgent
from pricing.policy import BodyFormat

from . import metrics
from .admission import refusal, reserve
from .auth import agent_auth, gate_of
from .canonical import Canonical
from .problems import Problem
from .proxy import agent_key_of
from .responses import budget_headers, escalation_id
from .wire import (
    StoredAnswer,
    StoredRequest,
    fingerprint,
    hold_id_for,
    parse_json_body,
    record_of,
)

log = logging.getLogger("irrev.gateway")
router = APIRouter(prefix="/v1/holds", tags=["decision API"])
Agent = Annotated[tuple[TenantPolicy, AuthenticatedAgent], Depends(agent_auth)]
MAX_MICROS = 2**53 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class HoldRequest(Strict):
    tool: str = Field(min_length=1, max_length=128)
    method: str = Field(pattern="^(GET|POST|PUT|PATCH|DELETE)$")
    path: str = Field(min_length=1, max_length=2048, pattern="^/")
    query: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] | None = None


class PostRequest(Strict):
    amount_micros: int | None = Field(default=None, ge=0, le=MAX_MICROS)


class AmbiguousRequest(Strict):
    reason: str = Field(default="caller_unsure", pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")


class CompensateRequest(Strict):
    recovered_micros: int = Field(ge=0, le=MAX_MICROS)


def hold_view(tenant: str, hold: Hold) -> dict[str, Any]:
    view: dict[str, Any] = {
        "hold": hold.hold_id,
        "state": hold.state.value,
        "decision": hold.decision.value,
        "reason": hold.reason.value,
        "amounts": hold.amounts,
        "posted": hold.posted,
        "compensated": hold.compensated,
        "flags": sorted(hold.flags),
        "deadline_ms": hold.deadline_ms,
    }
    if hold.state is HoldState.ESCALATED:
        view["escalation"] = escalation_id(tenant, hold.hold_id)
    return view


@router.post("", status_code=201)
async def create_hold(request: Request, spec: HoldRequest, who: Agent) -> JSONResponse:
    """Price an in-process effect and hold its budget: 201 admitted, 202 escalated,
    403 denied; a repeat of the Idempotency-Key returns the hold as it is now."""
    gate, (policy, agent) = gate_of(request), who
    # Read again strictly (exact numbers, no keys differing only in case), not from the
    # schema's lenient parse: the body is priced like a proxied one.
    document = parse_json_body(await request.body())
    body = document.get("body") if isinstance(document, dict) else None
    canonical = Canonical(
        tuple(spec.query.items()), None if body is None else BodyFormat.JSON, body
    )
    effect = price_request(
        policy,
        spec.tool,
        spec.method,
        spec.path,
        canonical.query_map,
        canonical.document,
        canonical.body_format,
    )
    if not effect.in_process:
        raise Problem(403, "route_is_proxied", "this route's effects go through /tools/...")
    check_per_effect_cap(agent, effect)
    route_id = effect.route.route_id if effect.route else f"{spec.tool} {spec.method} {spec.path}"
    hold_id = hold_id_for(policy.tenant, agent.agent_id, route_id, agent_key_of(request))
    query, raw = canonical.query_text, canonical.body
    stored = StoredRequest(
        agent.agent_id,
        spec.tool,
        spec.method,
        spec.path,
        query,
        canonical.content_type,
        base64.b64encode(raw).decode(),
        route_id,
        effect.price_micros,
    )
    result = await reserve(
        gate,
        policy,
        agent,
        effect,
        hold_id,
        fingerprint(spec.method, spec.path, query, raw),
        stored,
    )
    if result.decision is Decision.DENY:
        raise refusal(result, hold_id)
    headers = budget_headers(result, hold_id, replayed=result.replayed)
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    assert hold is not None
    status = 200 if result.replayed else 202 if result.state is HoldState.ESCALATED else 201
    if hold.state is HoldState.ESCALATED:
        headers["Location"] = f"/v1/escalations/{escalation_id(policy.tenant, hold_id)}"
    return JSONResponse(
        {**hold_view(policy.tenant, hold), "price": result.price, "remaining": result.remaining},
        status,
        headers=headers,
    )


async def owned_hold(
    request: Request, who: tuple[TenantPolicy, AuthenticatedAgent], hold_id: str
) -> tuple[str, Hold, StoredRequest | StoredAnswer]:
    """The caller's hold, with its record (request or answer) read once."""
    policy, agent = who
    hold = await gate_of(request).ledger.hold(policy.tenant, hold_id)
    record = record_of(hold.request, hold.outcome) if hold else None
    if hold is None or record is None or record.agent != agent.agent_id:
        raise Problem(404, "not_found", "no such hold for this agent")
    return policy.tenant, hold, record


@router.get("/{hold_id}")
async def get_hold(request: Request, hold_id: str, who: Agent) -> dict[str, Any]:
    tenant, hold, _ = await owned_hold(request, who, hold_id)
    return hold_view(tenant, hold)


def _receipt(agent: str, record: StoredRequest | StoredAnswer) -> str:
    return StoredAnswer.of(agent, 200, [], b"", route_id=record.route_id).dumps()


@router.post("/{hold_id}/post")
async def post_hold(
    request: Request, hold_id: str, spec: PostRequest, who: Agent
) -> dict[str, Any]:
    """The effect happened; `amount_micros` is its realised residual (default: the price)."""
    tenant, hold, record = await owned_hold(request, who, hold_id)
    amount = spec.amount_micros
    if amount is None:
        held = max(hold.amounts.values())
        amount = record.price if isinstance(record, StoredRequest) else held
    ledger = gate_of(request).ledger
    result = await ledger.post(tenant, hold_id, amount, outcome=_receipt(who[1].agent_id, record))
    if result.status is Status.OK:
        for flag in sorted(result.flags):
            metrics.FLAGGED_OUTCOMES.labels(tenant, flag).inc()
            log.warning(
                "outcome flagged", extra={"tenant": tenant, "hold_id": hold_id, "flag": flag}
            )
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


@router.post("/{hold_id}/void")
async def void_hold(request: Request, hold_id: str, who: Agent) -> dict[str, Any]:
    tenant, _, record = await owned_hold(request, who, hold_id)
    ledger = gate_of(request).ledger
    result = await ledger.void(tenant, hold_id, outcome=_receipt(who[1].agent_id, record))
    return {"hold": hold_id, "state": result.state.value}


@router.post("/{hold_id}/ambiguous")
async def ambiguous_hold(
    request: Request, hold_id: str, spec: AmbiguousRequest, who: Agent
) -> dict[str, Any]:
    tenant, _, _ = await owned_hold(request, who, hold_id)
    result = await gate_of(request).ledger.mark_ambiguous(tenant, hold_id, spec.reason)
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


@router.post("/{hold_id}/compensate")
async def compensate_hold(
    request: Request, hold_id: str, spec: CompensateRequest, who: Agent
) -> dict[str, Any]:
    tenant, _, record = await owned_hold(request, who, hold_id)
    ledger = gate_of(request).ledger
    result = await ledger.compensate(tenant, hold_id, spec.recovered_micros)
    route_id = record.route_id
    if result.status is Status.OK and route_id:
        # Counted after the ledger's change, outside its script: a crash in between
        # loses one observation (prices learn a little less), never money.
        outcome = "failures" if spec.recovered_micros == 0 else "successes"
        try:
            await ledger.redis.hincrby(observed_key(tenant, outcome), route_id, 1)
        except RedisError:
            log.warning("compensation outcome not counted", extra={"hold_id": hold_id})
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}
