"""The admission path shared by the proxy, approvals and the decision API: price ->
one reserve -> forward the very request -> settle the hold by what the upstream said.
Arithmetic lives in pricing/, state changes in ledger/; this module only orders them."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

import httpx

from ledger.client import Ledger
from ledger.errors import UnknownAccount
from ledger.records import HoldState, ReserveResult
from pricing import PricedEffect, TenantPolicy, hold_accounts
from pricing.credentials import AuthenticatedAgent

from . import metrics
from .crashpoints import crash_point
from .problems import Problem
from .settings import GatewaySettings
from .tenants import TenantStore, factor_accounts
from .upstream import Answer, Fate, Upstream, forward
from .wire import KEPT_RESPONSE_HEADERS, StoredAnswer, StoredRequest

log = logging.getLogger("irrev.gateway")


@dataclass
class Gate:
    """What every request handler needs; one per worker process."""

    settings: GatewaySettings
    ledger: Ledger
    tenants: TenantStore
    http: httpx.AsyncClient


async def reserve(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    effect: PricedEffect,
    hold_id: str,
    fingerprint: str,
    request: StoredRequest,
) -> ReserveResult:
    """One round trip. A risk-factor account met for the first time is opened by the
    reserve itself, only if it keeps the hold; an account the policy names but Redis
    lacks (a policy changed elsewhere) by a reload, then the reserve is repeated once:
    the only path with a second trip."""
    amounts = hold_accounts(policy, agent, effect)
    opens = factor_accounts(policy, amounts)

    async def attempt() -> ReserveResult:
        started = time.perf_counter()
        try:
            return await gate.ledger.reserve(
                policy.tenant,
                hold_id,
                fingerprint,
                amounts,
                ttl_ms=policy.hold_ttl_ms,
                escalation_ttl_ms=policy.escalation_ttl_ms,
                escalate_above=effect.approval_threshold_micros or 0,
                request=request.dumps(),
                open_missing=opens,
            )
        finally:
            metrics.LEDGER_SECONDS.labels("reserve").observe(time.perf_counter() - started)

    try:
        result = await attempt()
    except UnknownAccount:
        await gate.tenants.load(gate.ledger)
        result = await attempt()
    if not result.replayed:
        metrics.DECISIONS.labels(policy.tenant, result.decision, result.reason).inc()
        metrics.PRICES.labels(policy.tenant).observe(effect.price_micros)
        if result.state is HoldState.PENDING:
            await require_replicas(gate, policy.tenant, hold_id, result.replicas, agent.agent_id)
            crash_point("after_reserve")
    return result


async def require_replicas(
    gate: Gate, tenant: str, hold_id: str, acknowledged: int | None, agent_id: str
) -> None:
    """Fail closed when fewer replicas than IRREV_WAIT_REPLICAS acknowledged an
    admission: a failover could lose it while its effect happened. Nothing has been
    sent, so the hold is released, with this answer kept for a repeat of the key."""
    wanted = gate.settings.wait_replicas
    if acknowledged is None or acknowledged >= wanted:
        return
    problem = Problem(
        503,
        "not_replicated",
        f"the admission reached {acknowledged} of {wanted} Redis replicas within "
        f"{gate.settings.wait_timeout_ms} ms, so a failover could lose it; it was released "
        "and nothing was sent. Retry with a new Idempotency-Key.",
        headers={"Retry-After": "1"},
        hold=hold_id,
        replicas=acknowledged,
        wanted=wanted,
    )
    body = bytes(problem.response().body)
    answer = StoredAnswer.of(agent_id, 503, [("content-type", "application/problem+json")], body)
    await gate.ledger.void(tenant, hold_id, outcome=answer.dumps())
    metrics.DECISIONS.labels(tenant, "released", "not_replicated").inc()
    raise problem


async def fire(
    gate: Gate,
    policy: TenantPolicy,
    hold_id: str,
    request: StoredRequest,
    deadline_ms: int | None,
) -> Answer:
    """Forward an admitted effect once and settle its hold by the answer.
    `deadline_ms` is None for the retry of an ambiguous hold, which never expires."""
    mcp = gate.tenants.mcp_upstream(policy.tenant, request.tool)
    target = target_of(gate, policy, request.tool) if mcp is None else Upstream("")
    budget_s = (deadline_ms or 0) / 1000 - time.time() - gate.settings.forward_margin_s
    if deadline_ms is not None and budget_s < gate.settings.upstream_timeout_s:
        # Too close to the deadline: the answer could come after the hold turned
        # ambiguous. Not sent, so provably not fired: release it.
        await gate.ledger.void(policy.tenant, hold_id)
        raise Problem(503, "hold_deadline", "the hold is too close to its deadline to forward")
    if deadline_ms is None:
        # Sent again: the hold's deadline first moves past this request's life, so a
        # reconciler told "not found" while it is on its way cannot void it (contract 6).
        window_s = gate.settings.upstream_timeout_s + gate.settings.forward_margin_s
        await gate.ledger.retry(policy.tenant, hold_id, math.ceil(window_s * 1000))
    if mcp is not None:
        answer_by = time.monotonic() + gate.settings.upstream_timeout_s
        answer = await mcp.deliver(request, hold_id, answer_by, retry=deadline_ms is None)
    else:
        timeout_s = gate.settings.upstream_timeout_s
        answer = await forward(gate.http, target, request, hold_id, timeout_s)
    if deadline_ms is None and answer.status in target.in_progress:
        # The retry reached the upstream while it still makes the first request under
        # this key (the IETF Idempotency-Key draft's 409): not a refusal of the effect.
        answer = replace(answer, fate=Fate.IN_PROGRESS)
    if answer.fate is Fate.DELIVERED:
        crash_point("after_upstream_2xx")
    metrics.UPSTREAM_SECONDS.labels(request.tool).observe(answer.elapsed_s)
    metrics.UPSTREAM_OUTCOMES.labels(request.tool, answer.fate).inc()
    await settle(gate, policy.tenant, hold_id, request, answer, target.kept_headers)
    return answer


def target_of(gate: Gate, policy: TenantPolicy, tool_name: str) -> Upstream:
    target = gate.tenants.target(policy.tenant, tool_name)
    if target is None:
        raise Problem(403, "no_upstream", f"tool {tool_name!r} has no upstream to forward to")
    return target


async def settle(
    gate: Gate,
    tenant: str,
    hold_id: str,
    request: StoredRequest,
    answer: Answer,
    keep: frozenset[str] = KEPT_RESPONSE_HEADERS,
) -> None:
    """2xx: post at the held price (compensation returns what is recovered later);
    4xx or never sent: void; in progress: nothing (the hold stays ambiguous and a
    later retry learns the result); anything else: ambiguous, still charged."""
    if answer.fate is Fate.IN_PROGRESS:
        log.info("still in progress upstream", extra={"hold_id": hold_id, "status": answer.status})
        return
    started = time.perf_counter()
    operation = {Fate.DELIVERED: "post", Fate.UNKNOWN: "ambiguous"}.get(answer.fate, "void")
    try:
        if answer.fate is Fate.UNKNOWN:
            await gate.ledger.mark_ambiguous(tenant, hold_id, answer.why)
            return
        outcome = request.answer(*_recordable(answer), keep=keep).dumps()
        if answer.fate is Fate.DELIVERED:
            await gate.ledger.post(tenant, hold_id, request.price, outcome=outcome)
        else:
            await gate.ledger.void(tenant, hold_id, outcome=outcome)
    except Exception:
        # The effect's fate is known but not recorded: the hold stays pending, turns
        # ambiguous at its deadline and the reconciler settles it. Never released.
        log.exception("could not settle hold", extra={"hold_id": hold_id, "fate": answer.fate})
    finally:
        metrics.LEDGER_SECONDS.labels(operation).observe(time.perf_counter() - started)
    log.info("settled", extra={"hold_id": hold_id, "fate": answer.fate, "status": answer.status})


def _recordable(answer: Answer) -> tuple[int, list[tuple[str, str]], bytes]:
    if answer.fate is Fate.NOT_SENT:
        body = b'{"reason":"upstream_unreachable","detail":"the effect was never sent"}'
        return 502, [("content-type", "application/problem+json")], body
    return answer.status, list(answer.headers), answer.body


def refusal(result: ReserveResult, hold_id: str) -> Problem:
    """The 403 of a denied reserve, with the numbers that decided it."""
    binding = result.binding
    return Problem(
        403,
        "budget_exceeded",
        f"{binding.account} has {max(binding.available, 0)} of {binding.limit} left; "
        f"this effect is priced {binding.amount}",
        ledger_reason=result.reason.value,
        hold=hold_id,
        price=result.price,
        account=binding.account,
        limit=binding.limit,
        available=binding.available,
    )


def settled_problem(state: HoldState, hold_id: str) -> Problem:
    reasons = {
        HoldState.REJECTED: (403, "escalation_rejected", "a human rejected this effect"),
        HoldState.EXPIRED: (403, "hold_expired", "the hold expired before the effect was made"),
        HoldState.PENDING: (409, "in_flight", "this effect is being forwarded right now"),
    }
    status, reason, detail = reasons.get(
        state, (409, "state_conflict", f"the hold is {state.value}")
    )
    headers = {"Retry-After": "1"} if state is HoldState.PENDING else None
    return Problem(status, reason, detail, headers=headers, hold=hold_id, state=state.value)
