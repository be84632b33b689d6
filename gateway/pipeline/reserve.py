"""Reserve: one ledger round trip that holds a prepared effect's price on every
account it touches, or denies or escalates it, with the refusals a reserve can end
in and the durability checks (replicas, fsync) every admission waits for."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from gateway.edge import metrics, tracing
from gateway.edge.advice import budget_refusal, next_window, units_of
from gateway.edge.problems import Problem
from gateway.edge.responses import amounts_in_currency
from gateway.pipeline.crashpoints import crash_point
from gateway.pipeline.deliver import require_replicas
from gateway.pipeline.prepare import Gate, Prepared
from gateway.state.policies import ledger_account
from gateway.state.tenants import TenantStore, factor_accounts
from ledger import (
    HoldState,
    LedgerError,
    Margin,
    OpenPool,
    PoolShrank,
    PoolTicket,
    Provenance,
    Reason,
    ReserveResult,
    StressDetector,
    UnknownAccount,
    pool_tag,
)
from pricing import (
    AuthenticatedAgent,
    TenantPolicy,
    hold_accounts,
    policy_account,
    pooled_pending,
    priced_for,
    rfc3339,
    shadow_hold,
    stress_margin,
    stressed,
)

log = logging.getLogger("irrev.gateway")


async def reserve(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> ReserveResult:
    """One round trip; a denial is raised (403 with the numbers that decided it). A
    risk-factor account met for the first time is opened by the reserve itself, only
    if it keeps the hold; an account the policy names but Redis lost by writing it
    with the rest its tenant lacks (`TenantStore.open_missing`), then the reserve is
    repeated once; and a calibrating route's effect priced for more holds than are
    open (`reserve_priced`)."""
    result, _, _ = await reserve_priced(gate, policy, agent, prepared)
    return result


# Times a calibrating route's reserve is priced again for the open set the ledger
# answered with before it is priced for a hold alone (which the ledger never sends
# back): under churn the set may shrink again between the answer and the next try.
# One the ledger says would escalate is priced alone at once (PoolShrank.alone).
POOL_TRIES = 2


def _pooled(
    tenants: TenantStore, policy: TenantPolicy, prepared: Prepared, alone: bool
) -> tuple[Prepared, PoolTicket]:
    """A calibrating route's effect priced for its route's holds open across the
    fleet, as this process last saw them (`pooled_pending`), or for itself `alone`;
    and the ticket that makes the ledger count it in, and keep it only while the set
    is as large as its price assumed."""
    effect = prepared.effect
    face = effect.face_value_micros
    seen = tenants.pools.get((policy.tenant, effect.route_id), OpenPool())
    pending = 1.0 if alone else pooled_pending(seen.effective(face))
    priced = priced_for(effect, pending)
    request = replace(prepared.request, price=priced.price_micros)
    held = replace(prepared, effect=priced, request=request)
    if effect.route and effect.route.stress and not prepared.shadow:
        held = _held_stressed(held)
    # The approval thresholds compare the price alone: an agent can open holds to
    # pool over, and must not price its way under a threshold with them. A margin
    # raises it as it raises the threshold (`_threshold`), which so compares the same.
    solo = priced_for(effect, 1.0).price_micros
    if held.calm_price:
        solo += held.effect.price_micros - held.calm_price
    return held, PoolTicket(pool_tag(effect.route_id), face, pending, solo)


async def reserve_priced(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> tuple[ReserveResult, Prepared, PoolTicket | None]:
    """`reserve`, the effect as it was held and, for a calibrating route, the ticket
    it was held with (its price alone included): an effect of a calibrating route is
    priced for its route's holds open at once across the fleet (pricing/calibration.py,
    as the simulator prices it), which only its reserve can tell for sure: one that
    finds fewer open than its price assumed is sent back, priced again for the set
    the ledger saw and sent once more (`POOL_TRIES`, then priced for a hold alone).
    One that would escalate is sent back to be priced alone: an escalated hold waits
    outside the set and joins the one open when it is approved, however small."""
    hold_id = prepared.hold_id
    prepared = await under_stress(gate, policy, prepared)
    with tracing.span(
        "reserve",
        tenant=policy.tenant,
        agent=agent.agent_id,
        route=prepared.effect.route_id,
        hold_id=hold_id,
    ) as span:
        result, prepared, ticket = await _reserve_pooled(gate, policy, agent, prepared)
        tracing.annotate(
            span,
            price=prepared.effect.price_micros,
            decision=result.decision,
            reason=result.reason,
            replayed=result.replayed,
        )
    if not result.replayed:
        await _decided(gate, policy, agent, prepared, result)
        if prepared.calm_price and result.state in (HoldState.PENDING, HoldState.ESCALATED):
            await _keep_margin(gate, policy, prepared)
    if result.reason is Reason.ESCALATION_CAP:
        raise escalations_waiting(policy, agent, hold_id)
    if result.reason is Reason.ACCOUNT_CAP:
        raise accounts_opened(policy, agent, result)
    if result.state is HoldState.DENIED:
        raise refusal(policy, result, hold_id, prepared.effect.face_value_micros)
    return result, prepared, ticket


async def under_stress(gate: Gate, policy: TenantPolicy, prepared: Prepared) -> Prepared:
    """The effect counted by its route's stress detector, which every gateway of the
    tenant shares in its ledger (ledger/lua/detector.lua), and held at its stressed
    price (pricing's `stressed`): for good while the detector is on; while it is off,
    with the difference from its calm price as a margin (pricing/stress.py) that
    gateway/state/margins.py releases once the detector vouches for it. A repeat of
    the effect (its hold id taken: a model repeating a call, a retry) is not counted
    again. A route without a detector, or a shadow one, is left alone."""
    effect = prepared.effect
    stress = effect.route.stress if effect.route else None
    if stress is None or prepared.shadow:
        return prepared
    detector = StressDetector(
        tick_ms=stress.tick_ms,
        shift=stress.shift,
        h=stress.threshold,
        hold=stress.hold_ticks,
        warm_requests=stress.warm_requests,
        warm_ticks=stress.warm_ticks,
    )
    started = time.perf_counter()
    try:
        reading = await gate.ledger.stress_step(
            policy.tenant, effect.route_id, detector, prepared.hold_id
        )
    finally:
        metrics.child(metrics.LEDGER_SECONDS, "stress").observe(time.perf_counter() - started)
    if reading.tripped:
        metrics.child(metrics.STRESS_TRIPS, policy.tenant, effect.route_id).inc()
        log.warning("stress detector of %s %s tripped", policy.tenant, effect.route_id)
    if reading.on and reading.counted:
        metrics.child(metrics.STRESSED_EFFECTS, policy.tenant, effect.route_id).inc()
    return _held_stressed(replace(prepared, stressed=reading.on, stress_run=reading.run))


def _held_stressed(prepared: Prepared) -> Prepared:
    """`prepared` at its stressed price, and its calm price where that is a margin
    (the detector was off and the stressed price is higher)."""
    calm = prepared.effect.price_micros
    hot = stressed(prepared.effect)
    margin = 0 if prepared.stressed else stress_margin(calm, hot.price_micros)
    request = replace(prepared.request, price=hot.price_micros)
    return replace(prepared, effect=hot, request=request, calm_price=calm if margin else 0)


async def _keep_margin(gate: Gate, policy: TenantPolicy, prepared: Prepared) -> None:
    """Note a hold kept at its stressed price for its margin's release. Only after the
    hold is kept, and not for a replay (whose margin, if any, was noted with its own
    run): a hold whose note is lost (Redis away now) keeps its margin until it
    settles, which costs room, never money."""
    margin = Margin(
        tag=pool_tag(prepared.effect.route_id),
        run=prepared.stress_run,
        calm=prepared.calm_price,
        hold_id=prepared.hold_id,
    )
    try:
        await gate.ledger.keep_margin(policy.tenant, margin)
    except LedgerError as exc:
        log.warning("stress margin of %s kept until it settles: %s", prepared.hold_id, exc)


async def _reserve_pooled(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> tuple[ReserveResult, Prepared, PoolTicket | None]:
    """The reserve, sent again while a calibrating route's open set shrank under the
    price it was sent with; an account Redis lost is opened and the reserve repeated."""
    route = prepared.effect.route
    # A decision-only route's hold (/v1/holds) is one its agent may void itself at
    # no cost, so it would pad the open set that every other hold pools over: it is
    # priced alone and not counted (docs/policy.md, calibrate).
    pooling = route.pooling if route and not prepared.effect.in_process else None
    pool_key = (policy.tenant, prepared.effect.route_id)
    ticket: PoolTicket | None = None
    sent_back = 0
    while True:
        if pooling is not None:
            prepared, ticket = _pooled(gate.tenants, policy, prepared, sent_back == POOL_TRIES)
        try:
            try:
                result = await _reserve_once(gate, policy, agent, prepared, ticket)
            except UnknownAccount:
                await gate.tenants.open_missing(gate.ledger, policy.tenant)
                result = await _reserve_once(gate, policy, agent, prepared, ticket)
            break
        except PoolShrank as shrank:
            gate.tenants.pools[pool_key] = shrank.pool
            sent_back = POOL_TRIES if shrank.alone else sent_back + 1
    if result.pool is not None:
        gate.tenants.pools[pool_key] = result.pool
    return result, prepared, ticket


async def _reserve_once(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    ticket: PoolTicket | None,
) -> ReserveResult:
    effect = prepared.effect
    amounts = hold_accounts(policy, agent, effect)
    if prepared.shadow:
        # Decided and held on the accounts' shadow twins: a shadow route's effect,
        # whatever it costs, never takes room an enforced one needs.
        amounts, shadows = shadow_hold(policy, amounts)
        opens = [ledger_account(spec) for spec in shadows]
    else:
        opens = factor_accounts(policy, amounts)
    started = time.perf_counter()
    try:
        return await gate.ledger.reserve(
            policy.tenant,
            prepared.hold_id,
            prepared.fingerprint,
            amounts,
            ttl_ms=policy.hold_ttl_ms,
            escalation_ttl_ms=policy.escalation_ttl_ms,
            escalate_above=_threshold(prepared),
            request=prepared.request.dumps(),
            open_missing=opens,
            shadow=prepared.shadow,
            pool=ticket,
            # What the journal keeps of who asked and what was sent (issue 14).
            provenance=Provenance(
                route=effect.route_id,
                agent=agent.agent_id,
                principal=agent.principal_id,
                face_value=effect.face_value_micros,
                agent_key=prepared.agent_key,
            ),
        )
    finally:
        metrics.child(metrics.LEDGER_SECONDS, "reserve").observe(time.perf_counter() - started)


def _threshold(prepared: Prepared) -> int:
    """The route's approval threshold as the reserve compares it: a margin raises it
    by as much as the price, so that a hold held at its stressed price while the
    detector is off escalates exactly where its calm price would have."""
    threshold = prepared.effect.approval_threshold_micros or 0
    if threshold and prepared.calm_price:
        threshold += prepared.effect.price_micros - prepared.calm_price
    return threshold


async def _decided(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    result: ReserveResult,
) -> None:
    """A new decision counted and logged (what enforcement would have done, for a
    shadow one); an admission waits until it is durable as asked."""
    effect, hold_id = prepared.effect, prepared.hold_id
    would = shadowed(prepared, result)
    decision = would.decision if would else result.decision.value
    reason = would.reason if would else result.reason.value
    mode = "shadow" if prepared.shadow else "enforce"
    metrics.child(metrics.DECISIONS, policy.tenant, decision, reason, mode).inc()
    metrics.child(metrics.PRICES, policy.tenant).observe(effect.price_micros)
    log.info(
        "shadow decision" if would else "decision",
        extra={
            "tenant": policy.tenant,
            "agent": agent.agent_id,
            "route": effect.route_id,
            "decision": decision,
            "reason": reason,
            "mode": mode,
            "price": effect.price_micros,
            "hold_id": hold_id,
            "state": result.state.value,
        },
    )
    if result.state is HoldState.PENDING:
        await require_replicas(
            gate,
            policy.tenant,
            hold_id,
            result.replicas,
            agent.agent_id,
            prepared.key_name,
            result.fsynced,
        )
        crash_point("after_reserve")


@dataclass(frozen=True)
class Shadowed:
    """What enforcement would have done with an effect that shadow mode let through."""

    decision: str
    reason: str


def shadowed(prepared: Prepared, result: ReserveResult) -> Shadowed | None:
    """What enforcement would have done with a new decision that shadow mode held
    anyway: the per-effect cap's refusal first (it is checked before the ledger),
    else the ledger's deny or escalation; None when enforcement would have admitted."""
    if result.replayed:
        return None
    if prepared.cap_refusal:
        return Shadowed("deny", prepared.cap_refusal)
    if result.shadowed:
        return Shadowed(result.decision.value, result.reason.value)
    return None


def refusal(policy: TenantPolicy, result: ReserveResult, hold_id: str, face_value: int) -> Problem:
    """The 403 of a denied reserve, with the numbers that decided it: in words for the
    model (what is left, what would fit, when it renews), in minor units for programs."""
    binding = result.binding
    amounts = amounts_in_currency(
        policy, price=result.price, limit=binding.limit, available=binding.available
    )
    return Problem(
        403,
        "budget_exceeded",
        budget_refusal(units_of(policy), result, face_value),
        ledger_reason=result.reason.value,
        hold=hold_id,
        account=binding.account,
        renews_at=rfc3339(next_window(result.created_ms, policy.document.window_ms)),
        **amounts,
    )


def escalations_waiting(policy: TenantPolicy, agent: AuthenticatedAgent, hold_id: str) -> Problem:
    """429 of an effect that would wait for a person while its agent already has as
    many waiting as it may (policy `max_escalations`): nothing was held."""
    spec = policy_account(policy, f"agent:{agent.agent_id}")
    cap = spec.max_escalations if spec is not None else policy.document.max_escalations
    return Problem(
        429,
        "escalation_cap",
        f"This call would wait for a person's approval, but this agent already has {cap} "
        "calls waiting, the most it may have at once; it was not held",
        hold=hold_id,
        max_escalations=cap,
    )


def accounts_opened(
    policy: TenantPolicy, agent: AuthenticatedAgent, result: ReserveResult
) -> Problem:
    """429 of an effect that would open a risk-factor account (a new payee, a new
    supplier) past its agent's max_new_accounts this window: nothing was held."""
    spec = policy_account(policy, f"agent:{agent.agent_id}")
    cap = spec.max_new_accounts if spec is not None else policy.document.max_new_accounts
    return Problem(
        429,
        "account_cap",
        f"This call names a new counterparty (a new risk-factor account), and this agent "
        f"has opened {cap} this budget window, the most it may; it was not held",
        hold=result.hold_id,
        max_new_accounts=cap,
        renews_at=rfc3339(next_window(result.created_ms, policy.document.window_ms)),
    )
