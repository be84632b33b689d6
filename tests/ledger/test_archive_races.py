"""Archived holds (ledger/archive.py) attacked: archivers racing each other and the
callers that bring holds back, archivers SIGKILLed mid-pass, restores and reads
interleaved with archive passes, retention ending, and bad input straight to the
scripts. The promise under attack: an archived id is never admitted again while its
retention lasts, every operation on it answers as if it had stayed in the slot, and
no record is ever lost or changed by archiving."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from ledger import HoldState, ReserveRequest, Status
from ledger.archive import _copy, _read, archive_settled, digest, restore
from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import LedgerError
from ledger.journal import iter_journal
from ledger.keys import (
    accounts_key,
    archive_copy_key,
    archive_state_key,
    hold_key,
    payload_key,
    restored_key,
    settled_key,
)
from ledger.records import Hold

from .conftest import open_accounts
from .test_concurrency import finish, release, spawn

HOUR_MS = 3_600_000
BIG = 10**6
AMOUNT = {"tenant:acme": BIG, "agent:a": BIG}


async def _settled(
    ledger: Ledger, tenant: str, n: int, prefix: str = "h", *, outcome: bool = True
) -> list[str]:
    """n holds `<prefix>-<i>` reserved and posted at BIG (room for compensations)."""
    ids = [f"{prefix}-{i}" for i in range(n)]
    for hold_id in ids:
        await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS, request="req")
        text = f"{hold_id}:" + "x" * 300 if outcome else ""
        await ledger.post(tenant, hold_id, BIG, outcome=text)
    return ids


async def _archive_all(ledger: Ledger, tenant: str, batch: int = 200) -> int:
    total = 0
    for _ in range(1000):
        done = await archive_settled(ledger, tenant, after_ms=0, batch=batch)
        total += done.archived
        if not done.more:
            return total
    raise AssertionError("archive passes never ran out of work")


async def _in_slot(ledger: Ledger, tenant: str, ids: list[str]) -> int:
    return sum([await ledger.redis.exists(hold_key(tenant, h)) for h in ids])


async def _admissions(ledger: Ledger, tenant: str) -> Counter[str]:
    """How many times the journal says each id was reserved."""
    return Counter([e.hold_id async for e in iter_journal(ledger, tenant) if e.op == "reserve"])


async def _reads(ledger: Ledger, tenant: str, ids: list[str]) -> dict[str, Hold | None]:
    return {h: await ledger.hold(tenant, h) for h in ids}


# Bugs found: each test failed before the fix its docstring names.


async def test_post_many_replay_of_an_archived_hold_is_a_replay(
    ledger: Ledger, tenant: str
) -> None:
    """A post replayed through post_many answers as `post`'s replay does: before the
    fix, post_many (unlike post and reserve_many) did not restore an archived hold and
    its item came back HoldNotFound."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    ids = await _settled(ledger, tenant, 3)
    live = await _settled(ledger, tenant, 1, prefix="kept")
    assert await _archive_all(ledger, tenant) == 4
    await ledger.reserve(tenant, "fresh", "fp", AMOUNT, ttl_ms=HOUR_MS)
    await ledger.reserve(tenant, live[0], "fp", AMOUNT, ttl_ms=HOUR_MS)  # restored: in slot
    results = await ledger.post_many(tenant, [(h, BIG) for h in [*ids, *live, "fresh"]])
    for result in results:
        assert not isinstance(result, LedgerError), result
        assert result.state is HoldState.POSTED
    assert [r.status for r in results] == [Status.EXISTS] * 4 + [Status.OK]  # type: ignore[union-attr]
    [balance] = [b for b in await ledger.balances(tenant) if b.account == "tenant:acme"]
    assert (balance.pending, balance.posted) == (0, 5 * BIG)
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_a_hold_read_while_another_process_restores_and_archives_it_is_never_missing(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """Ledger.hold and Ledger.holds read a hold that another process keeps bringing
    back (a replay) and archiving again. Before the fix a read that found the slot
    empty and then, a round trip later, the index empty too (the restore ran in
    between) answered None for a hold that exists."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    (hold_id,) = await _settled(ledger, tenant, 1)
    before = await ledger.hold(tenant, hold_id)
    assert await _archive_all(ledger, tenant) == 1
    name, stop = f"{tenant}:barrier", f"{tenant}:stop"
    flipper = spawn("flip", redis_url, tenant, name, hold_id, stop)
    await release(ledger, name, 1)
    missing = reads = 0
    seen: list[Hold | None] = []
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline:
            for read in (
                await ledger.hold(tenant, hold_id),
                (await ledger.holds(tenant, [hold_id])).get(hold_id),
            ):
                if read != before:
                    missing += 1
                    seen.append(read)
            reads += 2
    finally:
        await ledger.redis.set(stop, "1")
    [result] = finish([flipper])
    assert int(result["flips"]) > 20  # type: ignore[call-overload]
    assert missing == 0, f"{missing} of {reads} reads did not find the hold as it was: {seen[:3]}"
    assert (await _admissions(ledger, tenant))[hold_id] == 1


async def test_a_restore_racing_a_restore_change_and_archive_is_not_a_lost_copy(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """A replay's restore reads the index entry, then the copy. Another caller, in
    between, restores the hold, compensates it and an archive pass takes it out
    again (a new record: a new copy, the entry names it). Before the fix the restore
    read the entry a second time for the copy, compared that copy's digest with the
    first entry and raised ArchivedCopyMissing (telling a caller whose replay should
    have been answered to use a new idempotency key)."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    (hold_id,) = await _settled(ledger, tenant, 1)
    assert await _archive_all(ledger, tenant) == 1
    other = Ledger.from_url(redis_url)
    redis: Any = ledger.redis
    real_hget, reads = redis.hget, []

    async def hget(key: str, field: str) -> Any:
        found = await real_hget(key, field)
        if key == settled_key(tenant) and found:
            reads.append(found)
            if len(reads) == 1:  # once the restore read the entry: the other caller acts
                assert (await other.compensate(tenant, hold_id, 1)).status is Status.OK
                assert await _archive_all(other, tenant) == 1
        return found

    redis.hget = hget
    try:
        again = await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS)
    finally:
        del redis.hget
        await other.aclose()
    assert len(reads) >= 2 and reads[0] != reads[-1]  # the entry named another copy
    assert again.status is Status.EXISTS and again.state is HoldState.POSTED
    hold = await ledger.hold(tenant, hold_id)
    assert hold is not None and hold.compensated["tenant:acme"] == 1
    assert (await _admissions(ledger, tenant))[hold_id] == 1
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_a_restored_hold_whose_retention_ends_in_the_slot_does_not_stall_the_archiver(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """A hold restored (a replay) whose retention ends before the archiver takes it
    again expires in the slot, and its id stayed in the restored set for good: the
    oldest first, a full page of such ids came back on every pass, so holds restored
    after them were never archived again and every pass said `more` (`irrev ledger
    archive` looped for ever). Here the page is one hold (batch=1); in production,
    200 replays of denied holds near their retention's end do it. Before the fix
    the restored set kept the dead id."""
    short = Ledger.from_url(redis_url, retention_ms=1500)
    try:
        await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
        (dying,) = await _settled(short, tenant, 1, prefix="dying")
        (kept,) = await _settled(ledger, tenant, 1, prefix="kept")
        assert await _archive_all(ledger, tenant) == 2
        for hold_id in (dying, kept):  # restored, in this order
            await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS)
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.6)  # the dying hold's retention ends in the slot
        assert await _in_slot(ledger, tenant, [dying, kept]) == 1
        passes = [await archive_settled(ledger, tenant, after_ms=0, batch=1) for _ in range(8)]
    finally:
        await short.aclose()
    assert sum(p.archived for p in passes) == 1
    assert not passes[-1].more
    assert await _in_slot(ledger, tenant, [kept]) == 0
    assert await ledger.redis.zcard(restored_key(tenant)) == 0
    assert await ledger.hold(tenant, dying) is None  # its retention is over
    assert (await ledger.hold(tenant, kept)).state is HoldState.POSTED  # type: ignore[union-attr]


async def test_holds_whose_copies_were_not_acknowledged_are_archived_by_a_later_pass(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """A pass whose copies the ledger's waits do not acknowledge (fewer replicas than
    asked) leaves the holds in the slot "for a later pass". Before the fix it moved
    the journal cursor past them all the same, and no later pass looked at them
    again: they stayed in the slot for their whole retention."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    ids = await _settled(ledger, tenant, 5)
    short = Ledger.from_url(redis_url, replicas=5, replica_timeout_ms=10)
    try:
        done = await archive_settled(short, tenant, after_ms=0)
    finally:
        await short.aclose()
    assert (done.archived, done.more) == (0, False)
    assert await _in_slot(ledger, tenant, ids) == 5
    assert await _archive_all(ledger, tenant) == 5
    assert await _in_slot(ledger, tenant, ids) == 0
