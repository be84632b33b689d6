"""Deliver: an admitted effect sent once through its `Upstream`, and its hold
settled by the answer's fate (posted, voided, or left ambiguous and charged). Also
the gate before sending: a ledger write that Redis did not make durable as the
settings ask (IRREV_WAIT_AOF, IRREV_WAIT_REPLICAS) sends nothing."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

from gateway.edge import metrics, tracing
from gateway.edge.problems import PROBLEM_JSON, Problem
from gateway.edge.wire import (
    BODY_OMITTED,
    BODY_OMITTED_REASON,
    OVER_ALLOWANCE,
    StoredAnswer,
    StoredRequest,
)
from gateway.pipeline.crashpoints import crash_point
from gateway.pipeline.prepare import KEYLESS_NAMES, Gate, same_again
from gateway.pipeline.upstream import Answer, Fate, Upstream
from gateway.state.http_upstream import HTTP_KEY
from ledger import (
    BODY_OMITTED_FLAG,
    AnswerAllowance,
    HoldInFlight,
    HoldState,
    LedgerUnavailable,
    Status,
    TransitionResult,
)
from pricing import (
    TenantPolicy,
)

log = logging.getLogger("irrev.gateway")


def answer_by(gate: Gate) -> float:
    """The monotonic instant an upstream must have answered by (`Upstream.deliver`)."""
    return time.monotonic() + gate.settings.upstream_timeout_s


async def fire(
    gate: Gate,
    policy: TenantPolicy,
    hold_id: str,
    request: StoredRequest,
    expires_at: float | None,
    upstream: Upstream,
    key_name: str = HTTP_KEY,
) -> Answer:
    """Deliver an admitted effect once and settle its hold by the answer.
    `expires_at` is the monotonic instant by which the hold's deadline (Redis's
    clock) may have passed, None for the retry of an ambiguous hold, which never
    expires. No wall clock is read: a host whose clock is off by seconds must not
    forward a hold whose deadline a reconciler elsewhere already sees passed."""
    budget_s = (expires_at or 0.0) - time.monotonic() - gate.settings.forward_margin_s
    claim = ""
    # The instant the upstream must have answered by, taken before anything is
    # awaited: a worker that stalls after its checks (a busy event loop, a GC pause)
    # shortens the send and cannot push its end past what the checks allowed.
    send_by = answer_by(gate)
    if expires_at is not None and budget_s < gate.settings.upstream_timeout_s:
        # Too close to the deadline: the answer could come after the hold turned
        # ambiguous. Not sent, so provably not fired: release it.
        await gate.ledger.void(policy.tenant, hold_id)
        raise Problem(503, "hold_deadline", "the hold is too close to its deadline to forward")
    if expires_at is None:
        # Sent again: first claimed, so that of any number of repeats of the key one is
        # sent at a time, and the hold's deadline moves past this request's life, so a
        # reconciler told "not found" while it is on its way cannot void it (contract 6).
        # The claim's window starts at Redis's time of the claim, after `send_by` was
        # taken: the send ends at least the margin before the claim lapses, however late
        # the claim's reply is read.
        window_s = gate.settings.upstream_timeout_s + gate.settings.forward_margin_s
        try:
            claimed = await gate.ledger.retry(policy.tenant, hold_id, math.ceil(window_s * 1000))
            claim = claimed.claim
        except HoldInFlight as exc:
            raise Problem(
                409,
                "in_flight",
                "this effect is being sent again by another repeat of it right now; "
                f"to learn its outcome, {same_again(key_name)} in a moment",
                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_ms / 1000)))},
                hold=hold_id,
                state=HoldState.AMBIGUOUS.value,
            ) from exc
        await _require_claim_kept(gate, policy.tenant, hold_id, claimed, key_name)
    started = time.perf_counter()
    retry = expires_at is None
    with tracing.span("forward", tool=request.tool, hold_id=hold_id, retry=retry) as span:
        if retry and time.monotonic() >= send_by:
            # The claim's reply came too late to send at all: a request begun now
            # could still be on its way once the claim lapsed.
            answer = Answer(fate=Fate.NOT_SENT, why="upstream_timeout")
        else:
            answer = await upstream.deliver(request, hold_id, send_by, retry=retry)
        tracing.annotate(span, fate=answer.fate.value, status=answer.status or None)
    elapsed_s = time.perf_counter() - started
    if answer.fate is Fate.DELIVERED:
        crash_point("after_upstream_2xx")
    metrics.child(metrics.UPSTREAM_SECONDS, request.tool).observe(elapsed_s)
    metrics.child(metrics.UPSTREAM_OUTCOMES, request.tool, answer.fate).inc()
    if retry and answer.fate in (Fate.NOT_SENT, Fate.REFUSED):
        answer = unproven_retry(answer)
    await settle(gate, policy, hold_id, request, answer, claim)
    return answer


async def _require_claim_kept(
    gate: Gate, tenant: str, hold_id: str, claimed: TransitionResult, key_name: str
) -> None:
    """A retry's claim is waited for as an admission is (IRREV_WAIT_REPLICAS,
    IRREV_WAIT_AOF), and its wait counts the hold's reserve written before it: short,
    a failover or a crash could lose the charge of an effect sent now, so it is not
    sent (contract 4). Unlike a short admission the hold is not released: its first
    send may have made the effect, so it stays ambiguous and charged, its claim ends
    (the next repeat may claim it again), and the answer is not kept for the key."""
    then = (
        "it was not sent again and stays charged, as its first send may have made it. "
        f"To learn its outcome, {same_again(key_name)} later"
    )
    problem = unacknowledged(
        gate, hold_id, claimed.replicas, claimed.fsynced, "this effect's charge", then
    )
    if problem is None:
        return
    try:
        await gate.ledger.mark_ambiguous(tenant, hold_id, problem.reason, claimed.claim)
    except Exception:
        log.exception("could not end a retry's claim; it lapses", extra={"hold_id": hold_id})
    raise problem


def unproven_retry(answer: Answer) -> Answer:
    """A retry that was never sent (connection refused, a full pool) or was refused
    (a 429, a 4xx, an MCP 'method not found') says nothing about the first send, which
    may have made the effect: the hold stays ambiguous and charged (its claim ends),
    and the agent is told to repeat the same key later, never to use a new one."""
    return replace(answer, fate=Fate.UNKNOWN, why=f"retry_{answer.why}")


async def settle(
    gate: Gate,
    policy: TenantPolicy,
    hold_id: str,
    request: StoredRequest,
    answer: Answer,
    claim: str = "",
) -> None:
    """2xx: post at the held price (compensation returns what is recovered later);
    4xx or never sent: void (a first send only: `fire` makes a retry's unknown, see
    `unproven_retry`); in progress: nothing (the hold stays ambiguous and a later retry
    learns the result); anything else: ambiguous, still charged. `claim`: a retry's
    claim (Ledger.retry), which ends when its send ends ambiguous again."""
    tenant = policy.tenant
    if answer.fate is Fate.IN_PROGRESS:
        log.info("still in progress upstream", extra={"hold_id": hold_id, "status": answer.status})
        try:
            # Still ambiguous: this retry's claim ends, so the next repeat may ask again.
            await gate.ledger.mark_ambiguous(tenant, hold_id, "upstream_in_progress", claim)
        except Exception:
            log.exception("could not end a retry's claim; it lapses", extra={"hold_id": hold_id})
        return
    started = time.perf_counter()
    operation = {Fate.DELIVERED: "post", Fate.UNKNOWN: "ambiguous"}.get(answer.fate, "void")
    with tracing.span("settle", tenant=tenant, hold_id=hold_id, operation=operation):
        try:
            write = _settlement(gate, policy, hold_id, request, answer, claim)
            await write()
        except LedgerUnavailable as exc:
            # Known but not written (Redis away, a slot moving past the wait): written
            # later by this process, so the hold is not left pending for the reconciler.
            log.warning(
                "settlement not written; trying again",
                extra={"hold_id": hold_id, "fate": answer.fate, "cause": exc.cause},
            )
            gate.resettle.later(hold_id, operation, write)
        except Exception:
            # The effect's fate is known but not recorded: the hold stays pending, turns
            # ambiguous at its deadline and the reconciler settles it. Never released.
            log.exception("could not settle hold", extra={"hold_id": hold_id, "fate": answer.fate})
        finally:
            metrics.child(metrics.LEDGER_SECONDS, operation).observe(time.perf_counter() - started)
    log.info(
        "settled",
        extra={"tenant": tenant, "hold_id": hold_id, "fate": answer.fate, "status": answer.status},
    )


def _settlement(
    gate: Gate,
    policy: TenantPolicy,
    hold_id: str,
    request: StoredRequest,
    answer: Answer,
    claim: str,
) -> Callable[[], Awaitable[Any]]:
    """The ledger write that records `answer`'s fate (settle), as a call that can be
    made again."""
    tenant = policy.tenant
    if answer.fate is Fate.UNKNOWN:
        return partial(gate.ledger.mark_ambiguous, tenant, hold_id, answer.why, claim)
    stored = recorded(request, answer)
    allowance = kept_allowance(policy, stored)
    outcome = stored.dumps()
    write: Callable[[], Awaitable[TransitionResult]]
    if answer.fate is Fate.DELIVERED:
        price = request.price
        write = partial(
            gate.ledger.post, tenant, hold_id, price, outcome=outcome, allowance=allowance
        )
    else:
        write = partial(gate.ledger.void, tenant, hold_id, outcome=outcome, allowance=allowance)
    return partial(_kept, tenant, hold_id, stored, write)


def kept_allowance(policy: TenantPolicy, stored: StoredAnswer) -> AnswerAllowance | None:
    """The allowance `stored` is kept within (None: it has no body to leave out), for
    every settlement that keeps an upstream's answer, the forward's and the
    reconciler's alike: kept whole within the agent's allowance of the day, else
    without its body, so that one agent's answers cannot fill the Redis its tenant's
    admissions need, however its calls ended."""
    short = stored.without_body()
    if short is None:
        return None
    bytes_per_day = policy.document.request_limits.kept_answer_bytes
    return AnswerAllowance(stored.agent, bytes_per_day, short.dumps())


async def _kept(
    tenant: str,
    hold_id: str,
    stored: StoredAnswer,
    write: Callable[[], Awaitable[TransitionResult]],
) -> TransitionResult:
    """A settlement `write` of the answer `stored`, counting a body it did not keep:
    over MAX_RECORDED_BODY (wire.StoredAnswer.of), or past the agent's allowance (the
    ledger's flag). A replayed settlement ('exists') kept nothing new."""
    result = await write()
    if result.status is not Status.OK:
        return result
    if BODY_OMITTED_FLAG in result.flags:
        reason, size = OVER_ALLOWANCE, len(stored.body)
        log.info(
            "answer kept without its body: the agent's kept_answer_bytes of the day are used",
            extra={"tenant": tenant, "hold_id": hold_id, "agent": stored.agent},
        )
    elif notes := stored.omitted():
        reason, size = notes[BODY_OMITTED_REASON], int(notes[BODY_OMITTED])
    else:
        return result
    metrics.child(metrics.BODIES_OMITTED, tenant, reason).inc()
    metrics.child(metrics.BODY_BYTES_OMITTED, tenant, reason).inc(size)
    return result


UNREACHABLE = (
    b'{"reason":"upstream_unreachable","detail":"the tool could not be reached; '
    b'nothing was sent and the hold was released"}'
)


def recorded(request: StoredRequest, answer: Answer) -> StoredAnswer:
    """The answer a settled hold keeps for repeats of its key (delivered, refused or
    never sent: an unknown fate keeps none), in HTTP's shape, which the proxy, the
    escalation poll and the events read back (`Answer.as_http`). The upstream kept
    only the headers that may reach the agent: all are recorded."""
    if answer.fate is Fate.NOT_SENT:
        problem = [("content-type", PROBLEM_JSON)]
        return request.answer(502, problem, UNREACHABLE, reason="upstream_unreachable")
    http = answer.as_http()
    kept = frozenset(name.lower() for name, _ in http.headers)
    return request.answer(http.status, list(http.headers), answer.payload, keep=kept)


async def require_replicas(
    gate: Gate,
    tenant: str,
    hold_id: str,
    acknowledged: int | None,
    agent_id: str,
    key_name: str = HTTP_KEY,
    fsynced: int | None = None,
) -> None:
    """Fail closed when the primary did not fsync an admission to its AOF in time
    (IRREV_WAIT_AOF=local, WAITAOF's first count), or fewer replicas than
    IRREV_WAIT_REPLICAS acknowledged it: a crash or a failover could lose it while
    its effect happened. Nothing has been sent, so the hold is released, with this
    answer kept for a repeat of the key. (A wait that answered an error counts as
    short: the ledger says so, as the write was made.)"""
    released = "it was released and nothing was sent. " + (
        "Repeat it: an identical call is decided anew"
        if key_name in KEYLESS_NAMES
        else f"Retry with a new {key_name}"
    )
    problem = unacknowledged(gate, hold_id, acknowledged, fsynced, "the admission", released)
    if problem is None:
        return
    body = bytes(problem.response().body)
    answer = StoredAnswer.of(
        agent_id, 503, [("content-type", PROBLEM_JSON)], body, reason=problem.reason
    )
    await gate.ledger.void(tenant, hold_id, outcome=answer.dumps())
    metrics.DECISIONS.labels(tenant, "released", problem.reason, "enforce").inc()
    raise problem


def unacknowledged(
    gate: Gate,
    hold_id: str,
    acknowledged: int | None,
    fsynced: int | None,
    write: str,
    then: str,
) -> Problem | None:
    """The 503 of a `write` that the primary did not fsync (WAITAOF's first count 0)
    or fewer replicas than IRREV_WAIT_REPLICAS acknowledged in time, saying `then`
    (what became of the hold); None when it was acknowledged as asked."""
    wanted = gate.settings.wait_replicas
    timeout = gate.settings.wait_timeout_ms
    if fsynced == 0:
        return Problem(
            503,
            "not_fsynced",
            f"Redis had not fsynced {write} to its append-only file within {timeout} ms, "
            f"so a crash could lose it; {then}.",
            headers={"Retry-After": "1"},
            hold=hold_id,
        )
    if acknowledged is not None and acknowledged < wanted:
        return Problem(
            503,
            "not_replicated",
            f"{write} reached {acknowledged} of {wanted} Redis replicas within {timeout} ms, "
            f"so a failover could lose it; {then}.",
            headers={"Retry-After": "1"},
            hold=hold_id,
            replicas=acknowledged,
            wanted=wanted,
        )
    return None
