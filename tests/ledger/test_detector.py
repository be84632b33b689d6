"""A route's stress detector in the ledger (lua/detector.lua, issue 28): the CUSUM
step of pricing/stress.py, by Redis's clock, one state per route shared by every
gateway, journaled when it trips and clears."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

import pytest

from ledger import BadInput, Ledger, StressDetector, StressReading, pool_tag, read_journal
from ledger.archive import archive_settled
from ledger.keys import hold_key, stress_key
from pricing import Cusum, CusumState, cusum_step

from .conftest import open_accounts

ROUTE = "POST /orders"
HOUR_MS = 3_600_000
# 10 ms ticks: a burst of 8 back-to-back requests alarms, even spread over 8 ticks by
# a loaded machine (on 2 ms ticks, spread over 40, it could read calm); a 300 ms pause
# ends a run.
DETECTOR = StressDetector(tick_ms=10, shift=4.0, h=4.0, hold=5, warm_requests=10, warm_ticks=100)
SECONDS = StressDetector(tick_ms=1000, shift=4.0, h=4.0, hold=5, warm_requests=10, warm_ticks=100)


async def burst_then_pause(ledgers: list[Ledger], tenant: str, seed: int) -> list[StressReading]:
    """Bursts of 8 back-to-back requests and calm trickles, alternating between
    `ledgers` request by request (each a gateway of its own)."""
    rng = random.Random(seed)
    readings: list[StressReading] = []
    for cycle in range(8):
        for _ in range(8 if cycle % 2 == 0 else 3):
            client = ledgers[len(readings) % len(ledgers)]
            hold_id = f"h{len(readings)}"
            readings.append(await client.stress_step(tenant, ROUTE, DETECTOR, hold_id))
            if cycle % 2:
                await asyncio.sleep(rng.uniform(0.05, 0.15))
        await asyncio.sleep(0.3)
    return readings


def folded(readings: list[StressReading]) -> list[tuple[object, ...]]:
    """pricing's cusum_step over the ticks the ledger stepped at, from the warm-up."""
    cusum = Cusum(DETECTOR.shift, DETECTOR.h, DETECTOR.hold)
    first = float(readings[0].tick)
    state = CusumState.warmed(float(DETECTOR.warm_requests), float(DETECTOR.warm_ticks), first)
    out: list[tuple[object, ...]] = []
    for r in readings:
        state, step = cusum_step(state, float(r.tick), True, cusum)
        end = (int(step.ended_at),) if step.ended else ()
        out.append((step.on, int(step.run), state.score, step.alarm, step.ended, *end))
    return out


def as_ledger_saw(readings: list[StressReading]) -> list[tuple[object, ...]]:
    return [
        (r.on, r.run, r.score, r.alarm, r.ended, *((r.ended_at,) if r.ended else ()))
        for r in readings
    ]


async def test_two_gateways_step_one_detector_as_pricing_does(redis_url: str, tenant: str) -> None:
    """The script and pricing's step agree on every request of a recorded stream,
    which two clients (two gateways) sent in turn: one state, not two, and the same
    transition as the simulator's."""
    ledgers = [Ledger.from_url(redis_url), Ledger.from_url(redis_url)]
    try:
        readings = await burst_then_pause(ledgers, tenant, seed=7)
    finally:
        for ledger in ledgers:
            await ledger.aclose()
    assert as_ledger_saw(readings) == folded(readings)
    # the stream tested something: it alarmed, priced stressed, and runs ended calm
    assert any(r.alarm for r in readings) and any(r.ended for r in readings)
    assert any(r.on for r in readings) and not all(r.on for r in readings)
    assert readings[-1].run == sum(r.alarm or r.ended for r in readings)
    # the runs an alarm ended are the ledger's alarmed runs, and no others
    closed = range(readings[-1].run)
    ledger = Ledger.from_url(redis_url)
    try:
        alarmed = await ledger.alarmed_runs(tenant, pool_tag(ROUTE), list(closed))
    finally:
        await ledger.aclose()
    assert alarmed == {r.run - 1 for r in readings if r.alarm}


async def test_a_trip_and_its_clearing_are_journaled(ledger: Ledger, tenant: str) -> None:
    readings = await burst_then_pause([ledger], tenant, seed=3)
    trips = [r.tick for r in readings if r.tripped]
    clears = [r.tick for r in readings if r.cleared]
    assert trips and clears
    entries = [e for e in await read_journal(ledger, tenant) if e.op == "stress"]
    assert {e.fields["route"] for e in entries} == {ROUTE}
    on = [int(e.fields["tick"]) for e in entries if e.fields["st"] == "on"]
    off = [int(e.fields["tick"]) for e in entries if e.fields["st"] == "off"]
    assert on == trips and len(off) == len(clears)
    # each clearing names the tick the detector went off: the hold after its last alarm
    assert all(a < b for a, b in zip(on, off, strict=False))


async def test_new_settings_start_the_detector_again(ledger: Ledger, tenant: str) -> None:
    """Ticks of a second (SECONDS): 8 back-to-back requests trip it however slow the
    machine, where on 2 ms ticks a loaded CI machine spread them calm."""
    for i in range(8):
        hot = await ledger.stress_step(tenant, ROUTE, SECONDS, f"h{i}")
    assert hot.on
    other = dataclasses.replace(SECONDS, h=6.0)
    fresh = await ledger.stress_step(tenant, ROUTE, other, "h8")
    # its runs numbered on: a run's number names one run for ever (margins are kept by it)
    assert not fresh.on and fresh.run == hot.run + 1 and fresh.score == math.log(4.0)
    # it went off now, by the new settings, and the journal says when
    assert fresh.cleared
    [off] = [e for e in await read_journal(ledger, tenant) if e.fields.get("st") == "off"]
    assert int(off.fields["tick"]) == fresh.tick


async def test_a_repeat_is_not_counted_again(ledger: Ledger, tenant: str) -> None:
    """A model repeating a call, or an agent retrying one, is one effect: the requests
    of a hold already kept (or settled and archived, its id still taken) leave the
    detector as it was. Counted, 20 back-to-back requests would trip it. Ticks of a
    second (SECONDS): the 8 new requests at the end fall in one or two ticks however
    slow the machine, where 2 ms ticks let a loaded one spread them calm."""
    first = await ledger.stress_step(tenant, ROUTE, SECONDS, "r1")
    assert first.counted and not first.on
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    await ledger.reserve(tenant, "r1", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS)
    before = await ledger.stress_states(tenant)
    for _ in range(20):
        repeat = await ledger.stress_step(tenant, ROUTE, SECONDS, "r1")
        assert not repeat.counted and not repeat.on and not repeat.alarm
    await ledger.post(tenant, "r1", 10)
    assert await archive_settled(ledger, tenant, after_ms=0, keep_restored_ms=0)
    assert await ledger.redis.exists(hold_key(tenant, "r1")) == 0
    for _ in range(20):
        assert not (await ledger.stress_step(tenant, ROUTE, SECONDS, "r1")).counted
    assert await ledger.stress_states(tenant) == before
    # new requests count, and a few back to back trip it
    fresh = [await ledger.stress_step(tenant, ROUTE, SECONDS, f"n{i}") for i in range(8)]
    assert all(r.counted for r in fresh) and fresh[-1].on


@pytest.mark.parametrize(
    ("field", "value"),
    [("shift", 1.0), ("h", 0.0), ("hold", -1), ("tick_ms", 0), ("warm_ticks", 0.5)],
)
async def test_bad_settings_are_refused_and_write_nothing(
    ledger: Ledger, tenant: str, field: str, value: float
) -> None:
    settings = {
        "tick_ms": 1000,
        "shift": 4.0,
        "h": 4.0,
        "hold": 5,
        "warm_requests": 10.0,
        "warm_ticks": 100.0,
    }
    settings[field] = value
    with pytest.raises(BadInput):
        await ledger.stress_step(tenant, ROUTE, StressDetector(**settings), "h")  # type: ignore[arg-type]
    assert await ledger.redis.exists(stress_key(tenant)) == 0
