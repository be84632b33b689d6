"""The decision-only API for tools that run in-process: authorise, then capture
(post), void or mark ambiguous by id, like a card authorisation or Envoy ext_authz."""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.edge import metrics
from gateway.edge.auth import Settling, agent_auth, settling_auth
from gateway.edge.bodies import body_schema, read_json, schema_refusal
from gateway.edge.canonical import Canonical
from gateway.edge.problems import Problem
from gateway.edge.responses import (
    amounts_in_currency,
    decision_headers,
    escalation_id,
    hold_view,
    stored_response,
)
from gateway.edge.wire import StoredAnswer, StoredRequest, parse_json_body, receipt, record_of
from gateway.pipeline.decision import Decision, decided, escalate
from gateway.pipeline.deliver import unacknowledged
from gateway.pipeline.prepare import Gate, Intent, prepare
from gateway.pipeline.reserve import reserve_priced, shadowed
from ledger import MAX_AMOUNT, Hold, HoldState, Ledger, LedgerError, Status, TransitionResult
from pricing import (
    TOP_KEPT,
    AuthenticatedAgent,
    BodyFormat,
    EffectClass,
    RequestLimits,
    TenantPolicy,
    factor_ppm,
)

log = logging.getLogger("irrev.gateway")
router = APIRouter(prefix="/v1/holds", tags=["decision API"])
AgentDep = Annotated[tuple[TenantPolicy, AuthenticatedAgent], Depends(agent_auth)]
Settler = Annotated[Settling, Depends(settling_auth)]
COMPENSABLE = frozenset({EffectClass.REVERSIBLE.value, EffectClass.COMPENSABLE.value})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class HoldRequest(Strict):
    tool: str = Field(min_length=1, max_length=128)
    method: str = Field(pattern="^(GET|POST|PUT|PATCH|DELETE)$")
    path: str = Field(min_length=1, max_length=2048, pattern="^/")
    query: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] | None = None


class PostRequest(Strict):
    amount_micros: int | None = Field(default=None, ge=0, le=MAX_AMOUNT)


class AmbiguousRequest(Strict):
    reason: str = Field(default="caller_unsure", pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")


class CompensateRequest(Strict):
    recovered_micros: int = Field(ge=0, le=MAX_AMOUNT)


class TrueUpRequest(Strict):
    realised_micros: int = Field(ge=0, le=MAX_AMOUNT)


Spec = TypeVar("Spec", bound=BaseModel)


async def read_spec(
    request: Request, limits: RequestLimits, model: type[Spec]
) -> tuple[Spec, object]:
    """The body as `model`, and as the document it was parsed into. Read by hand once
    the caller is known (and an agent holds its slot), as the proxy reads one: within
    the tenant's request_limits and strictly (exact numbers, no keys differing only in
    case), so that a refusal costs what the tenant allows, not IRREV_MAX_BODY_BYTES of
    parsing and one validation error per key."""
    gate = Gate.of(request)
    largest = min(gate.settings.max_body_bytes, limits.max_body_bytes)
    raw = await read_json(request, largest, gate.settings.body_timeout_s)
    document = parse_json_body(raw, limits)
    try:
        return model.model_validate(document), document
    except ValidationError as exc:
        raise schema_refusal(exc) from exc


def _canonical(spec: HoldRequest, document: object) -> Canonical:
    """The effect as priced: the body from the strict parse (read_spec), not from the
    schema's, so that it is priced like a proxied one."""
    body = document.get("body") if isinstance(document, dict) else None
    return Canonical(tuple(spec.query.items()), None if body is None else BodyFormat.JSON, body)


@router.post("", status_code=201, openapi_extra=body_schema(HoldRequest))
async def create_hold(request: Request, who: AgentDep) -> Response:
    """Price an in-process effect and hold its budget: 201 admitted, 202 escalated,
    403 denied; a repeat of the Idempotency-Key returns the hold as it is now, or the
    gateway's refusal it first got (a hold released unreplicated)."""
    gate, (policy, agent) = Gate.of(request), who
    with gate.agents.slot(policy, agent):
        spec, document = await read_spec(request, policy.document.request_limits, HoldRequest)
        return await _create_hold(gate, policy, agent, spec, document, request)


async def _create_hold(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    spec: HoldRequest,
    document: object,
    request: Request,
) -> Response:
    canonical = _canonical(spec, document)
    keys = request.headers.getlist("idempotency-key")
    intent = Intent(
        tool=spec.tool, operation=spec.method, target=spec.path, canonical=canonical, keys=keys
    )
    prepared = prepare(policy, agent, intent, in_process=True)
    # reserve_priced: the effect as it was held (a route's burst detector prices it)
    result, prepared, _ = await reserve_priced(gate, policy, agent, prepared)
    if result.state is HoldState.ESCALATED:
        with contextlib.suppress(Problem):  # a person was first: the hold says how
            await escalate(gate, policy, agent, result)
    hold = await gate.ledger.hold(policy.tenant, prepared.hold_id)
    assert hold is not None
    decision = decided(
        result, prepared, None, shadowed=shadowed(prepared, result), state=hold.state
    )
    if result.replayed and hold.outcome:
        kept = StoredAnswer.loads(hold.outcome)
        if kept.reason:
            # Contract 3: the refusal again, not a 200 with the released hold's 'admit'
            # that the in-process tool would act on.
            return stored_response(kept, decision_headers(policy, decision))
    return decision_json(policy, decision, hold)


def decision_json(policy: TenantPolicy, decision: Decision, hold: Hold) -> JSONResponse:
    """The decision as the decision API answers it: the hold as it is now, with the
    decision's price and what remains, and the decision in headers as the proxy's."""
    headers = decision_headers(policy, decision)
    result = decision.result
    status = 200 if decision.replayed else 202 if result.state is HoldState.ESCALATED else 201
    if decision.escalated:
        headers["Location"] = f"/v1/escalations/{escalation_id(policy.tenant, decision.hold_id)}"
    view = hold_view(policy, hold)
    body = {
        **view,
        **amounts_in_currency(policy, price=decision.price, remaining=decision.remaining),
    }
    if decision.stress:
        body["stress"] = decision.stress
    if decision.calm_price:
        body |= amounts_in_currency(policy, calm_price=decision.calm_price)
    return JSONResponse(body, status, headers=headers)


def agents_slot(request: Request, who: Settling) -> contextlib.AbstractContextManager[None]:
    """An agent's settlement takes its slot, as its effects do; a settler's or an
    admin's is no agent's request."""
    if who.agent is None:
        return contextlib.nullcontext()
    return Gate.of(request).agents.slot(who.policy, who.agent)


def _tool_of(route_id: str) -> str:
    return route_id.partition(" ")[0]


async def settled_by(
    request: Request, who: Settling, hold_id: str, *, reading: bool = False
) -> tuple[Hold, StoredRequest | StoredAnswer]:
    """The hold `who` may settle (or, `reading`, see), with its record read once.

    Only the trusted side settles a proxied hold: the gateway itself (its forward,
    its reconciler), an admin, or the settler credential of the hold's own tool.
    An agent sees its own holds and settles only those of in-process routes."""
    hold = await Gate.of(request).ledger.hold(who.policy.tenant, hold_id)
    record = record_of(hold.request, hold.outcome) if hold else None
    if hold is None or record is None or (who.agent and record.agent != who.agent.agent_id):
        raise Problem(404, "not_found", "no such hold for this caller")
    if who.tool and _tool_of(record.route_id) != who.tool:
        raise Problem(
            403, "settlement_forbidden", f"this settler settles only holds of tool {who.tool!r}"
        )
    if who.agent is not None and not record.in_process and not reading:
        raise Problem(
            403,
            "settlement_forbidden",
            "a proxied effect is settled by the gateway, its tool's settler or an admin; "
            "never by the agent",
            hold=hold_id,
        )
    return hold, record


def _price(hold: Hold) -> int:
    return max(hold.amounts.values(), default=0)


def _overrun_reports(policy: TenantPolicy, route_id: str) -> bool:
    for group in policy.catalog.routes.values():
        for route in group:
            if route.route_id == route_id:
                return policy.document.routes[route.index].overrun_report
    return False


def check_amount(
    who: Settling, hold: Hold, record: StoredRequest | StoredAnswer, amount: int
) -> None:
    """A reported residual may exceed the hold's price only when the reporter is
    trusted (settler, admin) or the route takes an agent's overrun report, and never
    the effect's face value: a realised loss cannot exceed the exposure. (Records
    from before face values were kept are bounded by the price.)"""
    price = _price(hold)
    if amount <= price:
        return
    if who.agent is not None and not _overrun_reports(who.policy, record.route_id):
        raise Problem(
            422,
            "amount_above_price",
            f"{amount} is above the hold's price {price}, and this route takes no overrun "
            "report from agents (route field overrun_report)",
            price=price,
        )
    ceiling = max(price, record.face_value)
    if amount > ceiling:
        raise Problem(
            422,
            "amount_above_face_value",
            f"{amount} is above the effect's face value {ceiling}: a realised loss cannot "
            "exceed the exposure",
            price=price,
            face_value=ceiling,
        )


@router.get("/{hold_id}")
async def get_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    hold, _ = await settled_by(request, who, hold_id, reading=True)
    return hold_view(who.policy, hold)


def _log_flags(tenant: str, hold_id: str, flags: frozenset[str]) -> None:
    for flag in sorted(flags):
        metrics.FLAGGED_OUTCOMES.labels(tenant, flag).inc()
        log.warning("outcome flagged", extra={"tenant": tenant, "hold_id": hold_id, "flag": flag})


async def _learn(
    ledger: Ledger,
    who: Settling,
    hold_id: str,
    route_id: str,
    failed: bool,
    realised: tuple[int, int] | None = None,
) -> None:
    """One learning outcome per hold, and only from the trusted side: an agent's
    say-so about its own effect never moves the tenant's prices. With `realised`
    (residual, face value) the route's calibrating price learns its factor too."""
    if not who.trusted or not route_id:
        return
    # Counted after the ledger's change, outside its script: a crash in between loses
    # one observation (prices learn a little less), never money.
    try:
        await ledger.learn(who.policy.tenant, hold_id, route_id, failed)
        if realised is not None and realised[1] > 0:
            ppm = factor_ppm(*realised)
            await ledger.calibrate(who.policy.tenant, hold_id, route_id, ppm, TOP_KEPT)
    except LedgerError:
        log.warning("compensation outcome not counted", extra={"hold_id": hold_id})


@router.post("/{hold_id}/post", openapi_extra=body_schema(PostRequest))
async def post_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    """The effect happened; `amount_micros` is its realised residual (default: the
    price), bounded as `check_amount` says."""
    with agents_slot(request, who):
        spec, _ = await read_spec(request, who.policy.document.request_limits, PostRequest)
        return await _post_hold(request, hold_id, who, spec)


async def _post_hold(
    request: Request, hold_id: str, who: Settling, spec: PostRequest
) -> dict[str, Any]:
    hold, record = await settled_by(request, who, hold_id)
    amount = spec.amount_micros
    if amount is None:
        amount = record.price if isinstance(record, StoredRequest) else _price(hold)
    check_amount(who, hold, record, amount)
    tenant = who.policy.tenant
    result = await Gate.of(request).ledger.post(tenant, hold_id, amount, outcome=receipt(record))
    if result.status is Status.OK:
        _log_flags(tenant, hold_id, result.flags)
    _refuse_short(request, hold_id, result)
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


@router.post("/{hold_id}/void")
async def void_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    _, record = await settled_by(request, who, hold_id)
    ledger = Gate.of(request).ledger
    result = await ledger.void(who.policy.tenant, hold_id, outcome=receipt(record))
    return {"hold": hold_id, "state": result.state.value}


@router.post("/{hold_id}/ambiguous", openapi_extra=body_schema(AmbiguousRequest))
async def ambiguous_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    with agents_slot(request, who):
        spec, _ = await read_spec(request, who.policy.document.request_limits, AmbiguousRequest)
        await settled_by(request, who, hold_id)
        ledger = Gate.of(request).ledger
        result = await ledger.mark_ambiguous(who.policy.tenant, hold_id, spec.reason)
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


@router.post("/{hold_id}/compensate", openapi_extra=body_schema(CompensateRequest))
async def compensate_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    """Part of a posted effect was recovered: it returns to the budget. An agent may
    not compensate an irreversible effect (nor one whose class was not recorded)."""
    with agents_slot(request, who):
        spec, _ = await read_spec(request, who.policy.document.request_limits, CompensateRequest)
        return await _compensate_hold(request, hold_id, who, spec)


async def _compensate_hold(
    request: Request, hold_id: str, who: Settling, spec: CompensateRequest
) -> dict[str, Any]:
    _, record = await settled_by(request, who, hold_id)
    if who.agent is not None and record.effect_class not in COMPENSABLE:
        raise Problem(
            403,
            "not_compensable",
            f"an effect of class {record.effect_class or 'unknown'!r} is not compensated "
            "by its agent",
            hold=hold_id,
        )
    ledger = Gate.of(request).ledger
    result = await ledger.compensate(who.policy.tenant, hold_id, spec.recovered_micros)
    if result.status is Status.OK:
        await _learn(ledger, who, hold_id, record.route_id, spec.recovered_micros == 0)
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


@router.post("/{hold_id}/settle", openapi_extra=body_schema(TrueUpRequest))
async def settle_hold(request: Request, hold_id: str, who: Settler) -> dict[str, Any]:
    """True-up (docs/design.md, "Windows, settlement, reconciliation"): a settler (or
    an admin) reports an effect's realised residual loss once it is known (compensation done,
    return window closed). A pending or ambiguous hold is posted at it; a posted
    hold's net charge (posted minus compensated) becomes it: the part above returns
    to the budget, a residual above is posted on top and, above the hold's price,
    flagged as an overrun. Never above the face value. Repeating the same report
    changes nothing; the first report of a hold teaches its route's prices (nothing
    recovered of the price: a failure)."""
    if who.agent is not None:
        raise Problem(
            403, "settlement_forbidden", "realised losses are reported by a settler or an admin"
        )
    # Read after the check: an agent's body is refused unread, whatever its size.
    spec, _ = await read_spec(request, who.policy.document.request_limits, TrueUpRequest)
    hold, record = await settled_by(request, who, hold_id)
    check_amount(who, hold, record, spec.realised_micros)
    tenant, ledger = who.policy.tenant, Gate.of(request).ledger
    if hold.state in (HoldState.PENDING, HoldState.AMBIGUOUS):
        result = await ledger.post(tenant, hold_id, spec.realised_micros, outcome=receipt(record))
    else:
        result = await ledger.true_up(tenant, hold_id, spec.realised_micros)
    if result.status is Status.OK:
        _log_flags(tenant, hold_id, result.flags - {"rolled_off"})
    failed = spec.realised_micros >= _price(hold)
    realised = (spec.realised_micros, record.face_value)
    await _learn(ledger, who, hold_id, record.route_id, failed, realised)
    _refuse_short(request, hold_id, result)
    return {"hold": hold_id, "state": result.state.value, "flags": sorted(result.flags)}


def _refuse_short(request: Request, hold_id: str, result: TransitionResult) -> None:
    """A settler's post or true-up whose wait came back short is answered 503 (the
    ledger has logged and counted it): the primary has it, a failover or a crash could
    lose it, and the settler is the one who can repeat it. Nothing is undone (the
    effect happened). The repeat makes it durable: a replay of the same settlement
    re-sets one field of the hold (post.lua, trueup.lua), so its own wait covers the
    settlement it replays, and a settlement lost in a failover is simply made again."""
    then = (
        "it is recorded on the primary but not yet durable, and nothing is undone: "
        "repeat the same request (it is idempotent) once the replicas or the disk are back"
    )
    problem = unacknowledged(
        Gate.of(request), hold_id, result.replicas, result.fsynced, "this settlement", then
    )
    if problem is not None:
        raise problem
