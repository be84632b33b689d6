"""Archived holds (ledger/archive.py) attacked: archivers racing each other and the
callers that bring holds back, archivers SIGKILLed mid-pass, restores and reads
interleaved with archive passes, retention ending, and bad input straight to the
scripts. The promise under attack: an archived id is never admitted again while its
retention lasts, every operation on it answers as if it had stayed in the slot, and
no record is ever lost or changed by archiving."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from ledger import HoldState, ReserveRequest, Status
from ledger.archive import _copy, _read, archive_settled, digest
from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import IdempotencyConflict, LedgerError
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
from .helpers import hold_record, settled_entry, stored_hold
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
        done = await archive_settled(ledger, tenant, after_ms=0, batch=batch, keep_restored_ms=0)
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
    statuses = []
    for result in results:
        assert not isinstance(result, LedgerError), result
        assert result.state is HoldState.POSTED
        statuses.append(result.status)
    assert statuses == [Status.EXISTS] * 4 + [Status.OK]
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
    assert int(result["flips"]) > 20
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
        passes = [
            await archive_settled(ledger, tenant, after_ms=0, batch=1, keep_restored_ms=0)
            for _ in range(8)
        ]
    finally:
        await short.aclose()
    assert sum(p.archived for p in passes) == 1
    assert not passes[-1].more
    assert await _in_slot(ledger, tenant, [kept]) == 0
    assert await ledger.redis.zcard(restored_key(tenant)) == 0
    assert await ledger.hold(tenant, dying) is None  # its retention is over
    assert (await stored_hold(ledger, tenant, kept)).state is HoldState.POSTED


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


# Attacks that held: each checks what the promise says, and fails if it breaks.


@pytest.mark.slow
async def test_racing_archivers_and_a_replaying_compensating_process_lose_nothing(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """Two archiver processes loop passes on one tenant while a third replays,
    compensates and reads back its archived holds: every replay is a replay, every
    compensation lands once, no read misses, and the audit is clean."""
    await open_accounts(ledger, tenant, tenant_acme=10**12, agent_a=10**12)
    ids = await _settled(ledger, tenant, 12, prefix="m")
    assert await _archive_all(ledger, tenant) == 12
    name, stop = f"{tenant}:barrier", f"{tenant}:stop"
    # Restored holds stay 200 ms (not RESTORED_KEEP_MS): archived again many times
    # while the meddler works on them.
    workers = [spawn("archiver", redis_url, tenant, name, stop, "200") for _ in range(2)]
    workers.append(spawn("meddle", redis_url, tenant, name, "m", "12", stop))
    await release(ledger, name, 3)
    await asyncio.sleep(6)
    await ledger.redis.set(stop, "1")
    archivers, meddler = finish(workers[:2]), finish(workers[2:])[0]
    assert meddler["errors"] == [] and meddler["fresh"] == 0, meddler
    assert sum(int(a["archived"]) for a in archivers) > 12
    compensated = int(meddler["compensated"])
    assert compensated > 12
    total = 0
    for hold in (await _reads(ledger, tenant, ids)).values():
        assert hold is not None and hold.state is HoldState.POSTED
        total += hold.compensated["tenant:acme"]
    assert total == compensated
    assert set((await _admissions(ledger, tenant)).values()) == {1}
    assert (await audit_tenant(ledger, tenant)).mismatches == []


@pytest.mark.slow
async def test_archivers_sigkilled_at_random_points_lose_and_change_nothing(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """An archiver SIGKILLed 20 times at random points (between writing copies and
    taking holds out, mid-pipeline, anywhere), each time with replays in between:
    every hold reads as before, the audit is clean, every id admitted once."""
    await open_accounts(ledger, tenant, tenant_acme=10**12, agent_a=10**12)
    ids = await _settled(ledger, tenant, 60, prefix="k")
    before = await _reads(ledger, tenant, ids)
    rng = random.Random(30)
    for round_ in range(20):
        name, stop = f"{tenant}:b{round_}", f"{tenant}:stop{round_}"
        archiver = spawn("archiver", redis_url, tenant, name, stop)
        await release(ledger, name, 1)
        await asyncio.sleep(rng.uniform(0.0, 0.08))
        archiver.send_signal(signal.SIGKILL)
        archiver.communicate(timeout=30)
        for hold_id in rng.sample(ids, 3):  # brought back, for the next to take again
            again = await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS)
            assert again.status is Status.EXISTS
    assert await _reads(ledger, tenant, ids) == before
    await _archive_all(ledger, tenant)
    assert await _in_slot(ledger, tenant, ids) == 0
    assert await _reads(ledger, tenant, ids) == before
    assert await _admissions(ledger, tenant) == Counter(dict.fromkeys(ids, 1))
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_an_archiver_dead_after_its_copies_leaves_the_holds_whole(
    ledger: Ledger, tenant: str
) -> None:
    """The state an archiver leaves when it dies after writing copies, before
    archive.lua: copies, holds still in the slot. A hold changed meanwhile is copied
    again under a new digest by the next pass, which takes out the record as it is
    now, never the stale copy."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    ids = await _settled(ledger, tenant, 3)
    now = await ledger.now_ms()
    records = await _read(ledger, tenant, ids, now, now)
    assert len(await _copy(ledger, tenant, records)) == 3  # ... and SIGKILL here
    assert await _in_slot(ledger, tenant, ids) == 3
    await ledger.compensate(tenant, ids[0], 7)
    before = await _reads(ledger, tenant, ids)
    assert await _archive_all(ledger, tenant) == 3
    assert await _reads(ledger, tenant, ids) == before
    assert (await stored_hold(ledger, tenant, ids[0])).compensated["tenant:acme"] == 7


async def test_restored_changed_and_archived_again_reads_back_with_the_change(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    (hold_id,) = await _settled(ledger, tenant, 1)
    assert await _archive_all(ledger, tenant) == 1
    for n in range(1, 4):
        assert (await ledger.compensate(tenant, hold_id, 5)).status is Status.OK
        assert await _archive_all(ledger, tenant) == 1
        hold = await ledger.hold(tenant, hold_id)
        assert hold is not None and hold.compensated["tenant:acme"] == 5 * n
    assert (await ledger.true_up(tenant, hold_id, BIG - 20)).status is Status.OK
    assert await _archive_all(ledger, tenant) == 1
    assert (await ledger.true_up(tenant, hold_id, BIG - 20)).status is Status.EXISTS
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_keyless_attach_of_an_archived_generation_within_and_past_its_window(
    ledger: Ledger, tenant: str
) -> None:
    """Within its dedupe window a repeat attaches to the archived generation (and
    replays it); past the window it moves on to the next generation, as it would
    had the hold stayed."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)

    def gen(g: int) -> str:
        return f"c-{g}"

    first = await ledger.attach(tenant, "content", gen, window_ms=1500, keep_ms=HOUR_MS)
    assert (first.hold_id, first.existing) == ("c-1", False)
    await ledger.reserve(tenant, "c-1", "fp", AMOUNT, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "c-1", 3)
    assert await _archive_all(ledger, tenant) == 1
    within = await ledger.attach(tenant, "content", gen, window_ms=1500, keep_ms=HOUR_MS)
    assert (within.hold_id, within.existing) == ("c-1", True)
    replay = await ledger.reserve(tenant, "c-1", "fp", AMOUNT, ttl_ms=HOUR_MS)
    assert replay.status is Status.EXISTS
    assert await _archive_all(ledger, tenant) == 1
    await asyncio.sleep(1.6)
    past = await ledger.attach(tenant, "content", gen, window_ms=1500, keep_ms=HOUR_MS)
    assert (past.hold_id, past.existing) == ("c-2", False)
    assert await _admissions(ledger, tenant) == Counter({"c-1": 1})


async def test_reserve_many_with_archived_live_and_new_ids(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**12, agent_a=10**12)
    archived = await _settled(ledger, tenant, 4, prefix="old")
    assert await _archive_all(ledger, tenant) == 4
    await ledger.reserve(tenant, "live", "fp", AMOUNT, ttl_ms=HOUR_MS)
    asked = [archived[0], "new-1", "live", archived[1], archived[2], "new-2", archived[0]]
    results = await ledger.reserve_many(
        tenant,
        [
            ReserveRequest(idempotency_key=k, fingerprint="fp", amounts=AMOUNT, ttl_ms=HOUR_MS)
            for k in asked
        ],
    )
    got = [(r.status, r.state) for r in results if not isinstance(r, LedgerError)]
    assert got == [
        (Status.EXISTS, HoldState.POSTED),
        (Status.OK, HoldState.PENDING),
        (Status.EXISTS, HoldState.PENDING),
        (Status.EXISTS, HoldState.POSTED),
        (Status.EXISTS, HoldState.POSTED),
        (Status.OK, HoldState.PENDING),
        (Status.EXISTS, HoldState.POSTED),
    ]
    counts = await _admissions(ledger, tenant)
    assert counts == Counter(dict.fromkeys([*archived, "live", "new-1", "new-2"], 1))
    assert await ledger.hold(tenant, archived[3]) is not None  # untouched, still archived
    assert await _in_slot(ledger, tenant, [archived[3]]) == 0


async def test_a_ledger_keeping_records_for_good_archives_and_replays_them(
    redis_url: str, tenant: str
) -> None:
    forever = Ledger.from_url(redis_url, retention_ms=0)
    try:
        await open_accounts(forever, tenant, tenant_acme=10**9, agent_a=10**9)
        ids = await _settled(forever, tenant, 3)
        before = await _reads(forever, tenant, ids)
        assert await _archive_all(forever, tenant) == 3
        for hold_id in ids:
            expiry, dg = await settled_entry(forever, tenant, hold_id)
            assert expiry == "0"
            assert await forever.redis.pttl(archive_copy_key(tenant, hold_id, dg)) == -1
        again = await forever.reserve(tenant, ids[0], "fp", AMOUNT, ttl_ms=HOUR_MS)
        assert again.status is Status.EXISTS
        assert await forever.redis.pttl(hold_key(tenant, ids[0])) == -1  # still for good
        assert await _reads(forever, tenant, ids) == before
        assert await _archive_all(forever, tenant) == 1
        assert (await archive_settled(forever, tenant, after_ms=0)).trimmed == 0
        assert await forever.redis.hlen(settled_key(tenant)) == 3
    finally:
        await forever.aclose()


async def test_entries_past_their_retention_are_trimmed_and_the_id_is_free_again(
    redis_url: str, tenant: str
) -> None:
    brief = Ledger.from_url(redis_url, retention_ms=300)
    try:
        await open_accounts(brief, tenant, tenant_acme=10**9, agent_a=10**9)
        ids = await _settled(brief, tenant, 3)
        assert await _archive_all(brief, tenant) == 3
        with pytest.raises(IdempotencyConflict):  # still its retention: restored, refused
            await brief.reserve(tenant, ids[0], "other-fp", AMOUNT, ttl_ms=HOUR_MS)
        await asyncio.sleep(0.4)
        assert await brief.hold(tenant, ids[1]) is None
        trimmed = sum(
            [(await archive_settled(brief, tenant, after_ms=0)).trimmed for _ in range(3)]
        )
        assert trimmed == 2 and await brief.redis.hlen(settled_key(tenant)) == 0
        fresh = await brief.reserve(tenant, ids[2], "fp", AMOUNT, ttl_ms=HOUR_MS)
        assert fresh.status is Status.OK and not fresh.replayed
    finally:
        await brief.aclose()


async def _refused(ledger: Ledger, operation: str, keys: list[str], args: list[str]) -> bool:
    """Whether the script refused the call: a bad_input (or not_archived) reply, or
    the error `bind` raises for keys of another tenant (before any write)."""
    try:
        reply = await ledger._run(operation, keys, args)
    except LedgerError as exc:
        # On a cluster the keys of two tenants are refused before they reach a script.
        return "must be a key of the tenant" in str(exc) or "slot" in str(exc).lower()
    return str(reply[0]) in ("bad_input", "not_archived")


async def test_bad_input_to_archive_and_restore_is_refused_with_nothing_written(
    ledger: Ledger, tenant: str
) -> None:
    """Wrong keys, another tenant's keys, malformed holds and a forged record in a
    restore, straight through `_run`: each refused, the slot and index unchanged."""
    await open_accounts(ledger, tenant, tenant_acme=10**9, agent_a=10**9)
    (hold_id,) = await _settled(ledger, tenant, 1)
    other = f"{tenant}x"
    fields, payload = await hold_record(ledger, tenant, hold_id)
    names, dg = digest(fields, payload)
    base = [accounts_key(tenant), settled_key(tenant), archive_state_key(tenant)]
    base.append(restored_key(tenant))
    mine = [hold_key(tenant, hold_id), payload_key(tenant, hold_id)]
    theirs = [hold_key(other, hold_id), payload_key(other, hold_id)]
    hold_args = [hold_id, dg, "0", str(len(names)), *names]

    async def state() -> tuple[Any, ...]:
        return (
            await ledger.redis.hgetall(hold_key(tenant, hold_id)),
            await ledger.redis.hgetall(settled_key(tenant)),
            await ledger.redis.hgetall(archive_state_key(tenant)),
            await ledger.redis.zrange(restored_key(tenant), 0, -1),
        )

    before = await state()
    refused = [
        (
            [*base[:1], restored_key(tenant), *base[2:3], settled_key(tenant), *mine],
            ["9-0", "", "1", *hold_args, "0"],
        ),
        ([*base, *theirs], ["9-0", "", "1", *hold_args, "0"]),  # another tenant's hold keys
        ([*base, *mine], ["9-0", "", "1", hold_id, "nothex0000000000", "0", "1", "st", "0"]),
        ([*base, *mine], ["9-0", "", "2", *hold_args, "0"]),  # n without its keys
        ([*base, *mine], ["9-0", "", "1", *hold_args, "1", hold_id]),  # an odd pair
        ([*base, *mine], ["9-0", "", "1", *hold_args, "0", "2", hold_id, "1"]),
    ]
    for keys, args in refused:
        assert await _refused(ledger, "archive", keys, args), (keys, args)
        assert await state() == before
    # A hold of this tenant under another tenant's accounts key.
    keys = [accounts_key(other), *base[1:], *mine]
    assert await _refused(ledger, "archive", keys, ["9-0", "", "1", *hold_args, "0"])
    assert await state() == before

    assert await _archive_all(ledger, tenant) == 1
    before = await state()
    flat = [x for name in names for x in (name, fields[name])]
    rkeys = [accounts_key(tenant), settled_key(tenant), restored_key(tenant), *mine]
    forged = [x if x != fields["st"] else "voided" for x in flat]
    for keys, args in [
        (rkeys, [hold_id, dg, str(len(names)), *forged, payload]),  # a forged record
        (rkeys, [hold_id, dg, str(len(names)), *flat, payload + "!"]),  # a forged payload
        ([*rkeys[:3], *theirs], [hold_id, dg, str(len(names)), *flat, payload]),
        ([rkeys[0], rkeys[2], rkeys[1], *mine], [hold_id, dg, str(len(names)), *flat, payload]),
        (rkeys, [hold_id, dg, str(len(names) + 1), *flat, payload]),
    ]:
        assert await _refused(ledger, "restore", keys, args), (keys, args[:3])
        assert await state() == before
    assert await ledger.hold(tenant, hold_id) is not None
