"""SIGKILL of a gateway worker at the four points of an effect's life, then a restart
and reconciliation. Gateway 1 is armed with the crash point (gateway/pipeline/crashpoints.py)
and dies there; "before the upstream answers" is a kill from outside while the
upstream holds the request. Gateway 0 is a healthy peer the agent retries on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import httpx

from ..bench import BenchSpec, Run
from ..checks import check_ledger, check_recovery_determinism
from ..matrix import Cell

TWO = BenchSpec(gateways=2)
DIE_TIMEOUT_S = 10.0
CHECKED = "restart, reconcile x2 from one store equal; retry on a peer: no 2nd effect"


async def _armed(run: Run, point: str) -> None:
    gateway = run.bench.gateways[1]
    if gateway.alive and gateway.crash_at != point:
        await asyncio.to_thread(gateway.stop)
    if not gateway.alive:
        await run.bench.start_gateway(1, point)
        await run.reload()


async def _died(run: Run, request: Awaitable[httpx.Response]) -> list[str]:
    """The request must end without an answer, and the worker must be dead."""
    try:
        response = await request
    except httpx.HTTPError:
        pass
    else:
        return [f"the crashing worker answered {response.status_code}: {response.text[:200]}"]
    dead = await asyncio.to_thread(run.bench.gateways[1].wait_dead, DIE_TIMEOUT_S)
    return [] if dead else ["the worker did not die at its crash point"]


async def _recover(run: Run, hold_id: str, final: str, key: str) -> list[str]:
    gateway = run.bench.gateways[1]
    await run.bench.start_gateway(1, gateway.crash_at)  # the restart, on the same port
    found = []
    if not await run.hold_state(hold_id):
        found.append(f"hold {hold_id} lost in the crash")
    await run.wait_past_deadlines()
    found += await check_recovery_determinism(run, gateway=1)
    report = await run.reconcile(gateway=1)
    state = await run.hold_state(hold_id)
    if state != final:
        found.append(f"after reconciling the hold is {state}, want {final}")
    before = await run.forwards(hold_id)
    retry = await run.order(key, gateway=0, quantity=_quantity(run, key))
    if await run.forwards(hold_id) != before:
        found.append(f"the agent's retry forwarded a settled hold again ({retry.status_code})")
    if retry.status_code >= 500:
        found.append(f"the agent's retry got {retry.status_code}: {retry.text[:200]}")
    return found + await check_ledger(run, [hold_id], unresolved=report["unresolved"])


def _quantity(run: Run, key: str) -> int:
    return 80 if key.startswith("esc-") else 2


async def after_reserve(run: Run) -> list[str]:
    await _armed(run, "after_reserve")
    key = uuid.uuid4().hex
    found = await _died(run, run.order(key, gateway=1))
    hold_id = run.hold_id(key)
    found += [] if await run.forwards(hold_id) == 0 else ["forwarded before the crash point"]
    return found + await _recover(run, hold_id, "voided", key)


async def before_upstream_answer(run: Run) -> list[str]:
    await _armed(run, "after_claim")  # any point the order path never reaches
    await run.faults(delay_s=4.0, apply=True, times=1)
    key = uuid.uuid4().hex
    hold_id = run.hold_id(key)
    request = asyncio.ensure_future(run.order(key, gateway=1))
    await run.wait_forwarded(hold_id)
    await asyncio.to_thread(run.bench.gateways[1].kill)
    found = await _died(run, request)
    return found + await _recover(run, hold_id, "posted", key)


async def after_upstream_2xx(run: Run) -> list[str]:
    await _armed(run, "after_upstream_2xx")
    key = uuid.uuid4().hex
    found = await _died(run, run.order(key, gateway=1))
    return found + await _recover(run, run.hold_id(key), "posted", key)


async def after_claim(run: Run) -> list[str]:
    await _armed(run, "after_claim")
    key = f"esc-{uuid.uuid4().hex}"
    escalated = await run.order(key, gateway=0, quantity=80)
    if escalated.status_code != 202:
        return [f"the order was not escalated: {escalated.status_code} {escalated.text[:200]}"]
    path = f"/v1/escalations/{escalated.json()['escalation']}/approve"
    found = await _died(run, run.admin("POST", path, gateway=1))
    hold_id = run.hold_id(key)
    found += [] if await run.forwards(hold_id) == 0 else ["forwarded before the crash point"]
    again = await run.admin("POST", path, gateway=0)
    if again.status_code != 409:
        found.append(f"a second approval after the crash answered {again.status_code}")
    return found + await _recover(run, hold_id, "voided", key)


def _cell(point: str, body: Callable[[Run], Awaitable[list[str]]], final: str) -> Cell:
    return Cell(
        name=f"crash.{point}", checked=f"{CHECKED}; -> {final}", body=body, spec=TWO, slow=True
    )


CELLS = [
    _cell("after_reserve", after_reserve, "voided"),
    _cell("before_upstream_answer", before_upstream_answer, "posted"),
    _cell("after_upstream_2xx", after_upstream_2xx, "posted"),
    _cell("after_claim", after_claim, "voided"),
]
