"""Redis faults: kill -9 of redis-server under load and a restart on the same AOF,
with `appendfsync always` and `everysec`; the gateway failing closed while Redis is
down and recovering by itself; Redis dying between an effect and its settlement;
a lost script cache."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx

from ..bench import BenchSpec, Run
from ..checks import check_ledger, check_recovery_determinism
from ..matrix import Cell

EVERYSEC = BenchSpec(appendfsync="everysec")
TRAFFIC_S = 0.8
CLIENTS = 4
RECOVERY_TIMEOUT_S = 20.0
KEPT = ("posted", "pending", "ambiguous")


async def _client(
    run: Run, stop: asyncio.Event, acked: list[tuple[str, float]], sent: list[str]
) -> None:
    while not stop.is_set():
        key = uuid.uuid4().hex
        sent.append(run.hold_id(key))
        try:
            response = await run.order(key, quantity=1, unit_price=1, timeout_s=10)
        except httpx.HTTPError:
            continue
        if response.status_code == 201:
            acked.append((run.hold_id(key), time.monotonic()))
        else:
            await asyncio.sleep(0.02)


# appendfsync everysec writes the AOF once per loop, and while a background fsync is
# slow Redis postpones that write for up to 2 s while it keeps answering: an
# acknowledged write of that window is only in Redis's memory, and a kill -9 loses it.
EVERYSEC_WINDOW_S = 2.0


def kill_under_load(loss_window_s: float) -> Callable[[Run], Awaitable[list[str]]]:
    """kill -9 redis-server while 4 agents order; every hold acknowledged before the
    mode's loss window (none for `always`) must be there after the restart, and the
    ledger must be whole. Notes how many were acknowledged in the last second and how
    many the kill lost: what the mode's window costs."""

    async def body(run: Run) -> list[str]:
        stop = asyncio.Event()
        acked: list[tuple[str, float]] = []
        sent: list[str] = []
        clients = [asyncio.ensure_future(_client(run, stop, acked, sent)) for _ in range(CLIENTS)]
        try:
            await asyncio.sleep(TRAFFIC_S)
            killed_at = time.monotonic()
            await run.bench.kill_redis()
            await asyncio.sleep(0.3)
        finally:
            stop.set()
            await asyncio.gather(*clients)
        await run.bench.restart_redis()
        # A 201 means the reserve was acknowledged (nothing is forwarded before it is)
        # and the effect made; the post may have died with Redis, leaving it pending.
        lost = {h for h, _ in acked if await run.hold_state(h) not in KEPT}
        allowed = {h for h, t in acked if h in lost and t >= killed_at - loss_window_s}
        found = [
            f"acknowledged hold {h} lost (now {await run.hold_state(h)!r})"
            for h in sorted(lost - allowed)
        ]
        run.notes["acked"] = len(acked)
        run.notes["lost_acked"] = len(lost)
        run.notes["acked_last_1s"] = sum(1 for _, t in acked if t >= killed_at - 1.0)
        kept = [h for h, _ in acked if h not in allowed]
        await run.wait_past_deadlines()
        found += await check_recovery_determinism(run)
        report = await run.reconcile()
        unposted = [h for h in kept if await run.hold_state(h) != "posted"]
        found += [f"acknowledged effect {h} not posted after reconciling" for h in unposted]
        return found + await check_ledger(run, kept, unresolved=report["unresolved"])

    return body


async def _ready(run: Run) -> bool:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        if (await run.bench.http.get(f"{run.url()}/readyz")).status_code == 200:
            return True
        await asyncio.sleep(0.1)
    return False


async def fails_closed(run: Run) -> list[str]:
    first = uuid.uuid4().hex
    found = []
    if (warm := await run.order(first)).status_code != 201:
        return [f"the first order got {warm.status_code}"]
    await run.bench.kill_redis()
    try:
        key = uuid.uuid4().hex
        down = await run.order(key)
        if down.status_code != 503 or down.json().get("reason") != "ledger_unavailable":
            found.append(f"with Redis down an order got {down.status_code}: {down.text[:200]}")
        if down.headers.get("retry-after") is None:
            found.append("the 503 has no Retry-After")
        if await run.forwards(run.hold_id(key)):
            found.append("an order was forwarded while the ledger was down")
        if (ready := await run.bench.http.get(f"{run.url()}/readyz")).status_code != 503:
            found.append(f"/readyz answered {ready.status_code} with Redis down")
    finally:
        await run.bench.restart_redis()
    if not await _ready(run):
        return [*found, f"not ready {RECOVERY_TIMEOUT_S:g} s after Redis came back"]
    again = await run.order(key)
    if again.status_code != 201:
        found.append(f"after recovery the order got {again.status_code}: {again.text[:200]}")
    replay = await run.order(first)
    if replay.headers.get("x-irrev-replayed") != "true":
        found.append(f"the order acknowledged before the crash was not replayed: {replay.text}")
    return found + await check_ledger(run, [run.hold_id(first), run.hold_id(key)])


async def down_during_settle(run: Run) -> list[str]:
    """Redis dies after the reserve, while the upstream works: the effect happens,
    the post fails, the hold stays pending, turns ambiguous at its deadline and is
    reconciled to posted. Never released."""
    await run.faults(delay_s=0.6, apply=True, times=1)
    key = uuid.uuid4().hex
    hold_id = run.hold_id(key)
    request = asyncio.ensure_future(run.order(key))
    try:
        await run.wait_forwarded(hold_id)
        await run.bench.kill_redis()
        response = await request
    finally:
        await run.bench.restart_redis()
    found = []
    if response.status_code != 201:
        found.append(f"the agent got {response.status_code}, the effect was made: want 201")
    if (state := await run.hold_state(hold_id)) not in ("pending", "ambiguous"):
        found.append(f"after the restart the hold is {state!r}, want pending/ambiguous")
    await run.wait_past_deadlines()
    found += await check_recovery_determinism(run)
    report = await run.reconcile()
    if (state := await run.hold_state(hold_id)) != "posted":
        found.append(f"after reconciling the hold is {state}, want posted")
    return found + await check_ledger(run, [hold_id], unresolved=report["unresolved"])


async def script_flush(run: Run) -> list[str]:
    await run.bench.redis.script_flush()
    key = uuid.uuid4().hex
    response = await run.order(key)
    found = [] if response.status_code == 201 else [f"after SCRIPT FLUSH: {response.status_code}"]
    return found + await check_ledger(run, [run.hold_id(key)])


LOAD = "kill -9 under 4 agents' load, restart on the AOF"
CELLS = [
    Cell(
        name="redis.kill9_always",
        checked=f"appendfsync always: {LOAD}: 0 acked holds lost; reconcile x2 equal",
        body=kill_under_load(0.0),
        slow=True,
        standalone_only=True,
    ),
    Cell(
        name="redis.kill9_everysec",
        checked=f"appendfsync everysec: {LOAD}: no acked hold lost but in the last "
        f"{EVERYSEC_WINDOW_S:g} s (the mode's window; counted); reconcile x2 equal",
        body=kill_under_load(EVERYSEC_WINDOW_S),
        spec=EVERYSEC,
        slow=True,
        standalone_only=True,
    ),
    Cell(
        name="redis.down_fails_closed",
        checked="Redis down: 503 ledger_unavailable + Retry-After, nothing forwarded, /readyz 503; "
        "back by itself, acked holds replayed",
        body=fails_closed,
        standalone_only=True,
    ),
    Cell(
        name="redis.down_during_settle",
        checked="Redis dies while the upstream works: agent 201, hold never released, -> posted",
        body=down_during_settle,
        slow=True,
        standalone_only=True,
    ),
    Cell(
        name="redis.script_flush",
        checked="SCRIPT FLUSH: EVALSHA falls back, 201",
        body=script_flush,
    ),
]
