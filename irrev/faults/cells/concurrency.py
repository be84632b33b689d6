"""Concurrent delivery: k gateway processes (one uvicorn worker each, one shared
Redis) receive the same approval, or the same effect under one Idempotency-Key, at
the same moment. Exactly one wins and the effect fires once; the others get a clear
conflict (409) or the winner's answer, never a second effect."""

from __future__ import annotations

import asyncio
import uuid

from ..bench import BenchSpec, Run
from ..checks import check_ledger
from ..matrix import Cell

K_VALUES = (2, 4, 8, 16)


async def _warm(run: Run, k: int) -> None:
    """Open a connection to each of the k workers first, so the racing requests leave
    together instead of queueing behind k TCP handshakes."""
    await asyncio.gather(*(run.bench.http.get(f"{run.url(i)}/healthz") for i in range(k)))


async def approvals(run: Run, k: int) -> list[str]:
    key = uuid.uuid4().hex
    escalated = await run.order(key, quantity=80)
    if escalated.status_code != 202:
        return [f"not escalated: {escalated.status_code} {escalated.text[:200]}"]
    path = f"/v1/escalations/{escalated.json()['escalation']}/approve"
    await _warm(run, k)
    answers = await asyncio.gather(*(run.admin("POST", path, gateway=i) for i in range(k)))
    statuses = sorted(a.status_code for a in answers)
    hold_id = run.hold_id(key)
    found = []
    if statuses.count(201) != 1 or statuses.count(409) != k - 1:
        found.append(f"want one 201 and {k - 1} 409, got {statuses}")
    losers = [a.json().get("reason") for a in answers if a.status_code == 409]
    if any(reason != "escalation_resolved" for reason in losers):
        found.append(f"losers' reasons: {losers}")
    if (forwards := await run.forwards(hold_id)) != 1:
        found.append(f"the effect was forwarded {forwards} times")
    if (state := await run.hold_state(hold_id)) != "posted":
        found.append(f"the hold is {state}, want posted")
    return found + await check_ledger(run, [hold_id])


async def retries(run: Run, k: int) -> list[str]:
    key = uuid.uuid4().hex
    await _warm(run, k)
    answers = await asyncio.gather(*(run.order(key, gateway=i) for i in range(k)))
    hold_id = run.hold_id(key)
    found = []
    bodies = {a.content for a in answers if a.status_code == 201}
    others = [a for a in answers if a.status_code != 201]
    if len(bodies) != 1:
        found.append(f"want one answer body for every 2xx, got {len(bodies)}")
    for answer in others:
        if answer.status_code != 409 or answer.json().get("reason") != "in_flight":
            found.append(f"unexpected answer {answer.status_code}: {answer.text[:200]}")
    if (forwards := await run.forwards(hold_id)) != 1:
        found.append(f"the effect was forwarded {forwards} times")
    replay = await run.order(key, gateway=k - 1)
    if replay.status_code != 201 or replay.content not in bodies:
        found.append(f"a later replay got {replay.status_code}: {replay.text[:200]}")
    return found + await check_ledger(run, [hold_id])


def _cells(k: int) -> list[Cell]:
    spec = BenchSpec(gateways=k)

    async def approve(run: Run) -> list[str]:
        return await approvals(run, k)

    async def retry(run: Run) -> list[str]:
        return await retries(run, k)

    return [
        Cell(
            name=f"concurrency.approve_k{k}",
            checked=f"{k} workers approve one escalation at once: one 201, {k - 1} 409, 1 effect",
            body=approve,
            spec=spec,
        ),
        Cell(
            name=f"concurrency.retry_k{k}",
            checked=f"{k} workers get one Idempotency-Key at once: 1 forward, one answer, "
            "409 in_flight",
            body=retry,
            spec=spec,
        ),
    ]


CELLS = [cell for k in K_VALUES for cell in _cells(k)]
