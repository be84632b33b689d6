"""A calibrating route's open holds (lua/_lib.lua's pool fields): counted by the
scripts that open and close holds, so every gateway of a fleet prices from the same
count, and a reserve priced for more holds than are open is sent back (`reprice`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput, PoolShrank
from ledger.keys import ambiguous_key, deadlines_key, reserve_keys
from ledger.records import (
    AccountSpec,
    HoldState,
    OpenPool,
    PoolTicket,
    ReserveRequest,
    pool_tag,
)
from ledger.replies import decoded

from .conftest import open_accounts
from .helpers import server_ms, stored_hold, tenant_snapshot
from .test_concurrency import release, spawn

HOUR_MS = 3_600_000
TAG = pool_tag("pay POST /charges")


def ticket(face: int, pending: float = 1.0, alone: int | None = None) -> PoolTicket:
    return PoolTicket(TAG, face, pending, alone)


async def pool(ledger: Ledger, tenant: str) -> OpenPool:
    return (await ledger.open_pools(tenant)).get(TAG, OpenPool())


async def reserve(
    ledger: Ledger, tenant: str, key: str, face: int, pending: float = 1.0, amount: int = 10
) -> OpenPool | None:
    result = await ledger.reserve(
        tenant,
        key,
        "fp",
        {"tenant:acme": amount},
        ttl_ms=HOUR_MS,
        pool=ticket(face, pending, amount),
    )
    return result.pool


async def test_every_way_out_leaves_the_open_set(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    for i, face in enumerate((100, 200, 300, 400, 500)):
        await reserve(ledger, tenant, f"h{i}", face)
    assert await pool(ledger, tenant) == OpenPool(5, 1500, 550000.0)
    await ledger.post(tenant, "h0", 7)
    await ledger.void(tenant, "h1")
    await ledger.mark_ambiguous(tenant, "h2", "upstream_timeout")  # still open
    assert await pool(ledger, tenant) == OpenPool(3, 1200, 500000.0)
    await ledger.post(tenant, "h2", 3)  # an ambiguous hold settles: out
    await ledger.post(tenant, "h3", 3)
    assert await pool(ledger, tenant) == OpenPool(1, 500, 250000.0)
    await ledger.void(tenant, "h4")
    # The last one out takes the fields with it: no float residue outlives the set.
    assert TAG not in await ledger.open_pools(tenant)
    assert [b.account for b in await ledger.balances(tenant)] == ["tenant:acme"]
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_a_free_hold_counts_and_leaves_without_a_face(ledger: Ledger, tenant: str) -> None:
    """A face value of 0 joins and leaves the count (HINCRBY refuses '-0': this failed
    before on Redis 7 and 6.2 alike, found by the model test)."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "f0", 100)
    assert await reserve(ledger, tenant, "free", 0, amount=0) == OpenPool(2, 100, 10000.0)
    await ledger.void(tenant, "free")
    assert await pool(ledger, tenant) == OpenPool(1, 100, 10000.0)


async def test_replays_and_refusals_never_count(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=100)
    assert await reserve(ledger, tenant, "a", 50, amount=60) == OpenPool(1, 50, 2500.0)
    replay = await ledger.reserve(
        tenant, "a", "fp", {"tenant:acme": 60}, ttl_ms=HOUR_MS, pool=ticket(50)
    )
    assert replay.replayed and replay.pool is None
    denied = await ledger.reserve(
        tenant, "b", "fp", {"tenant:acme": 60}, ttl_ms=HOUR_MS, pool=ticket(70)
    )
    assert denied.decision == "deny"
    assert denied.pool == OpenPool(1, 50, 2500.0)  # the set as it is: without it
    assert await pool(ledger, tenant) == OpenPool(1, 50, 2500.0)
    # A non-calibrating reserve neither joins nor answers with a set.
    plain = await ledger.reserve(tenant, "c", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    assert plain.pool is None and (await pool(ledger, tenant)).count == 1


async def test_escalations_join_only_when_approved(ledger: Ledger, tenant: str) -> None:
    """An escalated hold was never sent and may never be: it would pad the set the
    others pool over (review1 F4), so it joins when a human approves it."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=10)
    )
    await reserve(ledger, tenant, "e1", 40, amount=20)
    await reserve(ledger, tenant, "e2", 60, amount=20)
    assert (await stored_hold(ledger, tenant, "e1")).state is HoldState.ESCALATED
    assert (await pool(ledger, tenant)).count == 0
    await ledger.approve(tenant, "e1", "ops", ttl_ms=HOUR_MS)  # pending: open now
    assert await pool(ledger, tenant) == OpenPool(1, 40, 1600.0)
    assert (await audit_tenant(ledger, tenant)).mismatches == []
    await ledger.reject(tenant, "e2", "ops")
    assert await pool(ledger, tenant) == OpenPool(1, 40, 1600.0)
    await ledger.void(tenant, "e1")
    assert (await pool(ledger, tenant)).count == 0


async def test_an_escalation_is_priced_alone_so_its_approval_never_joins_below_it(
    ledger: Ledger, tenant: str
) -> None:
    """An escalated hold waits outside the open set, and the set it joins when a
    human approves it may have shrunk by then: priced for the set it escalated
    beside, it would join a smaller one at a price made for more holds (before: the
    reserve priced for four escalated at 50, the three others closed, and the
    approval joined it to a set of one at 50, under its price alone of 80). A
    reserve priced for a pool that would escalate is sent back to be priced alone,
    the price every set covers; approval then changes no balance."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100)
    )
    for i in range(3):
        await reserve(ledger, tenant, f"o{i}", 100, amount=20)
    pooled = ticket(100, 4.0, 80)
    with pytest.raises(PoolShrank) as shrank:  # 60 + 50 is in the soft band
        await ledger.reserve(tenant, "e", "fp", {"tenant:acme": 50}, ttl_ms=HOUR_MS, pool=pooled)
    assert shrank.value.alone and shrank.value.pool == OpenPool(3, 300, 30000.0)
    assert await ledger.hold(tenant, "e") is None  # nothing written
    escalated = await ledger.reserve(
        tenant, "e", "fp", {"tenant:acme": 80}, ttl_ms=HOUR_MS, pool=ticket(100, 1.0, 80)
    )
    assert escalated.state is HoldState.ESCALATED and escalated.pool == OpenPool(3, 300, 30000.0)
    for i in range(3):
        await ledger.void(tenant, f"o{i}")
    await ledger.approve(tenant, "e", "ops", ttl_ms=HOUR_MS)
    hold = await ledger.hold(tenant, "e")
    assert hold is not None and hold.state is HoldState.PENDING
    assert dict(hold.amounts) == {"tenant:acme": 80}
    assert await pool(ledger, tenant) == OpenPool(1, 100, 10000.0)
    assert (await audit_tenant(ledger, tenant)).mismatches == []
    # In shadow mode nothing waits for a human: held at once, it joins priced pooled.
    await reserve(ledger, tenant, "o3", 100, amount=20)
    shadowed = await ledger.reserve(
        tenant,
        "s",
        "fp",
        {"tenant:acme": 50},
        ttl_ms=HOUR_MS,
        shadow=True,
        pool=ticket(100, 2.0, 80),
    )
    assert shadowed.shadowed and shadowed.pool == OpenPool(3, 300, 30000.0)


async def test_an_escalation_sent_back_writes_nothing_when_its_window_rolled(
    ledger: Ledger, tenant: str
) -> None:
    """A reserve sent back to be priced alone writes nothing, even when an account's
    budget window has rolled since its last write: the roll is journaled only once
    the decision is final (it was journaled before the decision, so a `reprice`
    that says nothing was written left a roll entry)."""
    window_ms = 100
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100, window_ms=window_ms)
    )
    for i in range(3):
        await reserve(ledger, tenant, f"o{i}", 100, amount=20)
    rolled_at = await server_ms(ledger) + window_ms  # past the next window's start
    while await server_ms(ledger) < rolled_at:
        await asyncio.sleep(0.01)
    before = await tenant_snapshot(ledger, tenant)
    with pytest.raises(PoolShrank) as shrank:  # 60 + 50 is in the soft band
        await ledger.reserve(
            tenant, "e", "fp", {"tenant:acme": 50}, ttl_ms=HOUR_MS, pool=ticket(100, 4.0, 80)
        )
    assert shrank.value.alone
    assert await tenant_snapshot(ledger, tenant) == before


async def test_an_expired_hold_found_ambiguous_rejoins(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await ledger.reserve(
        tenant, "x", "fp", {"tenant:acme": 5}, ttl_ms=1, armed=False, pool=ticket(30)
    )
    await asyncio.sleep(0.01)
    # A reserve that finds a hold due expires it first (`expire_first`), then decides.
    assert await reserve(ledger, tenant, "y", 20) == OpenPool(1, 20, 400.0)
    assert (await stored_hold(ledger, tenant, "x")).state is HoldState.EXPIRED
    await ledger.mark_ambiguous(tenant, "x", "late_answer")  # charged again: open again
    assert await pool(ledger, tenant) == OpenPool(2, 50, 1300.0)
    await ledger.void(tenant, "x")
    await ledger.void(tenant, "y")
    assert (await pool(ledger, tenant)).count == 0
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_a_price_for_more_holds_than_are_open_is_sent_back(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    for i in range(3):
        await reserve(ledger, tenant, f"o{i}", 100)
    # Three open of 100 and this one: an effective number of exactly 4.
    with pytest.raises(PoolShrank) as shrank:
        await reserve(ledger, tenant, "new", 100, pending=4.5)
    assert shrank.value.pool == OpenPool(3, 300, 30000.0)
    assert await ledger.hold(tenant, "new") is None  # nothing written
    assert await reserve(ledger, tenant, "new", 100, pending=4.0) == OpenPool(4, 400, 40000.0)
    # One large hold among small ones counts about one: (400 + 1000)^2 / (40000 + 10^6).
    assert OpenPool(4, 400, 40000.0).effective(1000) == pytest.approx(1.8846, abs=1e-4)
    with pytest.raises(PoolShrank):
        await reserve(ledger, tenant, "big", 1000, pending=1.9)
    # Priced for one hold (its tail), it is never sent back.
    assert (await reserve(ledger, tenant, "big", 1000, pending=1.0)) == OpenPool(5, 1400, 1040000.0)


async def test_bad_tickets_are_refused(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    for bad in (
        PoolTicket("not-a-tag", 1),
        PoolTicket(TAG, 1, 0.5),
        PoolTicket(TAG, -1),
        PoolTicket(TAG, 1, 2.0),  # pooled, without its price alone
    ):
        with pytest.raises(BadInput):
            await ledger.reserve(tenant, "k", "fp", {"tenant:acme": 1}, ttl_ms=1, pool=bad)


async def test_a_pooled_reserve_without_its_price_alone_is_refused(
    ledger: Ledger, tenant: str
) -> None:
    """The approval thresholds compare the price an effect would have alone
    (reserve.lua's last argument): a reserve priced for a pool that leaves it out (an
    older caller) would be compared at its pooled price, under a threshold its price
    alone is above. It is bad input, with nothing written (before, the script kept
    it: admitted at 10 under a threshold of 15)."""
    await ledger.upsert_account(
        tenant,
        AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000, approval_threshold=15),
    )
    for i in range(3):
        await reserve(ledger, tenant, f"o{i}", 100)
    args = ledger.reserve_args(
        ReserveRequest(
            idempotency_key="k",
            fingerprint="fp",
            amounts={"tenant:acme": 10},
            ttl_ms=HOUR_MS,
            pool=ticket(100, 2.0, 20),
        )
    )
    older = args[:-1]  # the same reserve without its price alone
    before = await tenant_snapshot(ledger, tenant)
    reply = await ledger._run("reserve", reserve_keys(tenant, "k"), older)
    assert reply[:2] == ["bad_input", "alone_price"]
    assert await tenant_snapshot(ledger, tenant) == before
    # With it, the threshold sees 20: it would escalate, so it is priced alone.
    sent_back = await ledger._run("reserve", reserve_keys(tenant, "k"), args)
    assert (sent_back[0], sent_back[-1]) == ("reprice", "alone")
    assert await tenant_snapshot(ledger, tenant) == before


async def test_many_processes_leave_the_count_exact(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """Six processes reserve and close holds of one route at once: every kept hold's
    reply counts itself (never below 1), the open set always matches the live holds
    (the audit), and once the holds left open (every fifth) are closed it is empty."""
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    name, route = f"{tenant}:barrier", "pay POST /charges"
    workers = [spawn("pooled", redis_url, tenant, name, f"p{p}", "60", route) for p in range(6)]
    await release(ledger, name, len(workers))
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["least"] >= 1
    assert (await audit_tenant(ledger, tenant)).mismatches == []

    # A worker's last 1 ms hold (step 3) may have met its own sweep within the same
    # millisecond of Redis time, still live: swept again once Redis time is past it.
    soon = await server_ms(ledger) + HOUR_MS // 2  # the 1 ms holds, not the hour-long ones
    short: list[tuple[str, float]] = await decoded(
        ledger.redis.zrangebyscore(deadlines_key(tenant), 0, soon, withscores=True)
    )
    last = max((score for _, score in short), default=0.0)
    while await server_ms(ledger) <= last:
        await asyncio.sleep(0.001)
    await ledger.sweep(tenant)
    assert (await pool(ledger, tenant)).count == 6 * 60 // 5  # step 4: left open
    for p in range(6):
        for i in range(4, 60, 5):
            await ledger.void(tenant, f"p{p}-{i}")
    assert TAG not in await ledger.open_pools(tenant)
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_sigkilled_processes_leave_the_count_exact(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    name, route = f"{tenant}:barrier", "pay POST /charges"
    workers = [spawn("pooled", redis_url, tenant, name, f"k{p}", "100000", route) for p in range(4)]
    await release(ledger, name, len(workers))
    for worker in workers:
        assert worker.stdout is not None
        for _ in range(40):
            assert worker.stdout.readline()
    for worker in workers:
        os.kill(worker.pid, signal.SIGKILL)
        worker.communicate(timeout=30)
    assert (await audit_tenant(ledger, tenant)).mismatches == []
    await ledger.sweep(tenant)
    live = await ledger.redis.zrange(deadlines_key(tenant), 0, -1)
    for hold_id in [*live, *await ledger.redis.smembers(ambiguous_key(tenant))]:
        await ledger.void(tenant, hold_id)
    assert TAG not in await ledger.open_pools(tenant)
