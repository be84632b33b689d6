"""Stress margins released by sweepers that crash (gateway/state/margins.py): two
sweeper processes release the margins of one tenant's holds at once, one is SIGKILLed
midway, and the other finishes. Releasing is two steps (lower the hold, then forget
its note), so a kill between them leaves a note for a hold already lowered: the next
round must lower nothing twice. Every hold ends at its calm price, each lowered once,
no note left, the audit clean."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ledger import Ledger, Margin, StressDetector, pool_tag
from ledger.audit import audit_tenant
from ledger.journal import iter_journal
from ledger.keys import journal_key
from ledger.records import AccountSpec
from pricing import Cusum, CusumState, margin_kept

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "POST /orders"
HOLDS = 600
STRESSED, CALM = 1000, 600
ACCOUNTS = ("tenant:acme", "agent:a1")
HOUR_MS = 3_600_000
# A run of this detector ends a tick (1 ms) after its request: every hold is vouched
# for by the time the sweepers start, so each lowers whatever the other has not.
DETECTOR = StressDetector(tick_ms=1, shift=2.0, h=1e6, hold=0, warm_requests=1000, warm_ticks=1000)


def sweeper(redis_url: str, tenant: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.gateway.margin_sweeper", redis_url, tenant],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def held_with_margins(ledger: Ledger, tenant: str) -> list[str]:
    """HOLDS holds at their stressed price, each noted with its margin, as
    pipeline/reserve.py's under_stress leaves them."""
    for account in ACCOUNTS:
        limit = STRESSED * HOLDS
        await ledger.upsert_account(
            tenant, AccountSpec(account=account, limit=limit, soft_limit=limit)
        )
    ids = [f"m{i}" for i in range(HOLDS)]
    for hold_id in ids:
        reading = await ledger.stress_step(tenant, ROUTE, DETECTOR, hold_id)
        amounts = dict.fromkeys(ACCOUNTS, STRESSED)
        await ledger.reserve(tenant, hold_id, "fp", amounts, ttl_ms=HOUR_MS)
        margin = Margin(tag=pool_tag(ROUTE), run=reading.run, calm=CALM, hold_id=hold_id)
        await ledger.keep_margin(tenant, margin)
    await vouched(ledger, tenant, reading.run)
    return ids


async def vouched(ledger: Ledger, tenant: str, run: int) -> None:
    """Waits until the detector vouches for the last request's run (by Redis's clock,
    as the sweeper asks: pricing's margin_kept), and so for every earlier one."""
    cusum = Cusum(DETECTOR.shift, DETECTOR.h, DETECTOR.hold)
    deadline = time.monotonic() + 30
    while True:
        state = CusumState.stored((await ledger.stress_states(tenant))[pool_tag(ROUTE)])
        tick = float(await ledger.now_ms() // DETECTOR.tick_ms)
        if not margin_kept(state, cusum, tick, run, alarmed=False):
            return
        assert time.monotonic() < deadline, "the detector's last run never ended"
        await asyncio.sleep(0.001)


async def shrinks(ledger: Ledger, tenant: str) -> list[str]:
    """The holds lowered, one per journaled shrink."""
    return [e.fields["hold"] async for e in iter_journal(ledger, tenant) if e.op == "shrink"]


async def test_a_sweeper_killed_midway_lowers_nothing_twice(redis_url: str, tenant: str) -> None:
    ledger = Ledger.from_url(redis_url)
    try:
        ids = await held_with_margins(ledger, tenant)
        journal = journal_key(tenant)
        before = await ledger.redis.xlen(journal)  # a shrink is the only entry to come
        victim, survivor = sweeper(redis_url, tenant), sweeper(redis_url, tenant)
        deadline = time.monotonic() + 60
        while await ledger.redis.xlen(journal) - before < HOLDS // 4:
            assert time.monotonic() < deadline, "the sweepers lowered nothing"
            await asyncio.sleep(0.002)
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=30)
        # it was still at work: a sweeper that found no note left would have exited 0
        assert victim.returncode == -signal.SIGKILL
        _, err = survivor.communicate(timeout=120)
        assert survivor.returncode == 0, err
        holds = await ledger.holds(tenant, ids)
        assert {h.amounts[a] for h in holds.values() for a in ACCOUNTS} == {CALM}
        lowered = await shrinks(ledger, tenant)
        assert sorted(lowered) == sorted(ids)  # each hold lowered once, by one sweeper
        assert await ledger.margins(tenant) == []
        for account in ACCOUNTS:
            balance = await ledger.balance(tenant, account)
            assert balance is not None and balance.pending == CALM * HOLDS
        report = await audit_tenant(ledger, tenant)
        assert report.mismatches == []
    finally:
        await ledger.aclose()
