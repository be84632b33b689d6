"""Upstream faults -> the states docs/design.md prescribes: 2xx post; 4xx or refused
before sending void; timeout, 5xx, a reset after sending or a body that never
finishes ambiguous, still charged. Nothing is released on a guess: an ambiguous
hold is settled only by what the upstream says when asked by idempotency key."""

from __future__ import annotations

import asyncio
import time
import uuid

from gateway.edge.wire import upstream_key

from ..bench import Run
from ..checks import check_ledger, check_recovery_determinism
from ..matrix import Cell

PRICE = 10_000_000  # 2 x 5 USD in micros


async def _charged(run: Run) -> int:
    balance = await run.bench.ledger.balance(run.tenant, f"tenant:{run.tenant}")
    return balance.pending if balance else -1


def _expect(what: str, got: object, want: object) -> list[str]:
    return [] if got == want else [f"{what}: got {got!r}, want {want!r}"]


async def _ambiguous_then(run: Run, hold_id: str, final: str, response_status: int) -> list[str]:
    """The agent got `response_status`; the hold must be ambiguous and charged until
    reconciled, and reconciliation (twice, from the same store) must reach `final`."""
    found = _expect("answer to the agent", response_status in (502, 504), True)
    found += _expect("state before reconciling", await run.hold_state(hold_id), "ambiguous")
    found += _expect("charged before reconciling", await _charged(run), PRICE)
    if final == "voided":
        await run.wait_past_deadlines()
    found += await check_recovery_determinism(run)
    report = await run.reconcile()
    found += _expect("state after reconciling", await run.hold_state(hold_id), final)
    found += await check_ledger(run, [hold_id], unresolved=report["unresolved"])
    return found


async def ok_posts(run: Run) -> list[str]:
    key = uuid.uuid4().hex
    response = await run.order(key)
    hold_id = run.hold_id(key)
    found = _expect("status", response.status_code, 201)
    found += _expect("state", await run.hold_state(hold_id), "posted")
    replay = await run.order(key)
    found += _expect("replay status", replay.status_code, 201)
    found += _expect("replay body", replay.content, response.content)
    found += _expect("replay header", replay.headers.get("x-irrev-replayed"), "true")
    return found + await check_ledger(run, [hold_id])


async def refused_4xx_voids(run: Run) -> list[str]:
    await run.faults(status=409, apply=False, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    hold_id = run.hold_id(key)
    found = _expect("status", response.status_code, 409)
    found += _expect("state", await run.hold_state(hold_id), "voided")
    found += _expect("charged", await _charged(run), 0)
    return found + await check_ledger(run, [hold_id])


async def connection_refused_voids(run: Run) -> list[str]:
    key = uuid.uuid4().hex
    response = await run.order(key, tool="closed")
    hold_id = run.hold_id(key, tool="closed")
    found = _expect("status", response.status_code, 502)
    found += _expect("reason", response.json().get("reason"), "upstream_unreachable")
    found += _expect("state", await run.hold_state(hold_id), "voided")
    found += _expect("charged", await _charged(run), 0)
    return found + await check_ledger(run, [hold_id])


async def timeout_ambiguous(run: Run) -> list[str]:
    await run.faults(delay_s=1.6, apply=True, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    found = _expect("reason", response.json().get("reason"), "upstream_ambiguous")
    return found + await _ambiguous_then(run, run.hold_id(key), "posted", response.status_code)


async def server_error_applied(run: Run) -> list[str]:
    await run.faults(status=503, apply=True, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    return await _ambiguous_then(run, run.hold_id(key), "posted", response.status_code)


async def server_error_not_applied(run: Run) -> list[str]:
    await run.faults(status=500, apply=False, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    hold_id = run.hold_id(key)
    # Before the deadline "not found" proves nothing (a forward may be in flight).
    report = await run.reconcile()
    found = _expect("listed before the deadline", hold_id in report["unresolved"], True)
    return found + await _ambiguous_then(run, hold_id, "voided", response.status_code)


async def reset_after_send(run: Run) -> list[str]:
    key = uuid.uuid4().hex
    response = await run.order(key, tool="flaky")
    hold_id = run.hold_id(key, tool="flaky")
    found = _expect("forwards", await run.forwards(hold_id), 1)
    return found + await _ambiguous_then(run, hold_id, "posted", response.status_code)


async def slow_body_past_timeout(run: Run) -> list[str]:
    # Four chunks 1.5 s apart: each wait is longer than the 1 s read timeout.
    await run.faults(slow_body_s=6.0, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    return await _ambiguous_then(run, run.hold_id(key), "posted", response.status_code)


async def slow_body_within_timeout(run: Run) -> list[str]:
    await run.faults(slow_body_s=0.4, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    hold_id = run.hold_id(key)
    found = _expect("status", response.status_code, 201)
    found += _expect("body", response.json().get("quantity"), 2)
    found += _expect("state", await run.hold_state(hold_id), "posted")
    return found + await check_ledger(run, [hold_id])


async def trickle_past_deadline(run: Run) -> list[str]:
    # Each chunk comes within the read timeout, the whole answer not within the total
    # one (which keeps forwards inside the hold's life): ambiguous, then reconciled.
    await run.faults(slow_body_s=3.6, times=1)
    key = uuid.uuid4().hex
    response = await run.order(key)
    return await _ambiguous_then(run, run.hold_id(key), "posted", response.status_code)


async def agent_retry_after_ambiguous(run: Run) -> list[str]:
    await run.faults(status=502, apply=True, times=1)
    key = uuid.uuid4().hex
    first = await run.order(key)
    hold_id = run.hold_id(key)
    found = _expect("first status", first.status_code, 502)
    retry = await run.order(key)
    found += _expect("retry status", retry.status_code, 201)
    found += _expect("state", await run.hold_state(hold_id), "posted")
    orders = [k for k in (await run.supplier_stats())["keys"] if hold_id in k]
    found += _expect("orders at the upstream", len(orders), 1)
    return found + await check_ledger(run, [hold_id], max_forwards=2)


async def _wait_made(run: Run, hold_id: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while upstream_key(hold_id) not in (await run.supplier_stats())["keys"]:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def in_progress_409(run: Run) -> list[str]:
    """The first request times out at the gateway but the upstream is still making it;
    the agent's retry gets 409 "request in progress" from the upstream. That must
    leave the hold ambiguous and charged (never void: the effect is being made), and
    the retry after it, or the reconciler, must post it, with one effect made."""
    await run.faults(delay_s=2.5, in_progress=True, times=1)
    key = uuid.uuid4().hex
    hold_id = run.hold_id(key)
    first = await run.order(key)
    found = _expect("first status", first.status_code, 504)
    retry = await run.order(key)
    found += _expect("retry status", retry.status_code, 409)
    found += _expect("retry reason", retry.json().get("reason"), "in_flight")
    found += _expect("retry has Retry-After", "retry-after" in retry.headers, True)
    found += _expect("state after the 409", await run.hold_state(hold_id), "ambiguous")
    found += _expect("charged after the 409", await _charged(run), PRICE)
    found += _expect("first request completed", await _wait_made(run, hold_id), True)
    if int(key[0], 16) % 2:  # half the runs settle by the agent's retry, half by reconciling
        final = await run.order(key)
        found += _expect("final retry status", final.status_code, 201)
    else:
        report = await run.reconcile()
        found += _expect("reconciled", hold_id in report["posted"], True)
    found += _expect("final state", await run.hold_state(hold_id), "posted")
    found += _expect("charged at the end", await _charged(run), 0)
    orders = [k for k in (await run.supplier_stats())["keys"] if hold_id in k]
    found += _expect("orders at the upstream", len(orders), 1)
    return found + await check_ledger(run, [hold_id], max_forwards=3)


CHECK_AMBIGUOUS = "502/504 ambiguous, still charged; reconcile x2 from one store equal"
CELLS = [
    Cell(
        name="upstream.2xx_posts",
        checked="201; posted; replay -> same body, no 2nd forward",
        body=ok_posts,
    ),
    Cell(
        name="upstream.4xx_voids",
        checked="upstream 409 -> voided, released; audit",
        body=refused_4xx_voids,
    ),
    Cell(
        name="upstream.refused_voids",
        checked="connection refused -> 502 unreachable; voided, released",
        body=connection_refused_voids,
    ),
    Cell(
        name="upstream.timeout_ambiguous",
        checked=CHECK_AMBIGUOUS + "; -> posted",
        body=timeout_ambiguous,
    ),
    Cell(
        name="upstream.5xx_applied",
        checked=CHECK_AMBIGUOUS + "; -> posted",
        body=server_error_applied,
    ),
    Cell(
        name="upstream.5xx_not_applied",
        checked=CHECK_AMBIGUOUS + "; unresolved before the deadline; -> voided after",
        body=server_error_not_applied,
        slow=True,
    ),
    Cell(
        name="upstream.reset_after_send",
        checked=CHECK_AMBIGUOUS + "; TCP RST -> posted",
        body=reset_after_send,
    ),
    Cell(
        name="upstream.slow_body_timeout",
        checked=CHECK_AMBIGUOUS + "; 2xx headers -> posted",
        body=slow_body_past_timeout,
    ),
    Cell(
        name="upstream.slow_body_ok",
        checked="slow body within timeout -> 201, posted",
        body=slow_body_within_timeout,
    ),
    Cell(
        name="upstream.trickle_past_deadline",
        checked="2xx body trickles past the total timeout -> " + CHECK_AMBIGUOUS + "; -> posted",
        body=trickle_past_deadline,
        slow=True,
    ),
    Cell(
        name="upstream.retry_ambiguous",
        checked="ambiguous, agent retries the key -> same Idempotency-Key, 1 order, posted",
        body=agent_retry_after_ambiguous,
    ),
    Cell(
        name="upstream.in_progress_409",
        checked="timeout, retry answered 409 in progress -> 409 in_flight, still ambiguous and "
        "charged, never voided; then posted by retry or reconcile, 1 order",
        body=in_progress_409,
    ),
]
