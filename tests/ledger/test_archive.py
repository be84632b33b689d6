"""Settled holds archived out of the tenant's slot (ledger/archive.py): the slot
keeps live holds only, and whatever a caller does with an archived hold's id is
answered as if it had stayed: a replay is a replay (never a second admission), a
compensation days later lands on it, a read finds it, an attach still attaches."""

from __future__ import annotations

import asyncio

import pytest

from ledger import HoldState, Status
from ledger.archive import ArchivedCopyMissing, archive_settled, digest
from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import IdempotencyConflict
from ledger.journal import iter_journal
from ledger.keys import (
    archive_copy_key,
    hold_key,
    payload_key,
    restored_key,
    settled_key,
)

from .conftest import open_accounts
from .helpers import hold_record, settled_entry

HOUR_MS = 3_600_000
AMOUNT = {"tenant:acme": 10, "agent:a": 10}


async def _settled(ledger: Ledger, tenant: str, n: int, prefix: str = "h") -> list[str]:
    """n holds reserved and posted (outcome long enough to be kept as a payload)."""
    ids = [f"{prefix}{i}" for i in range(n)]
    for hold_id in ids:
        await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS, request="req")
        await ledger.post(tenant, hold_id, 10, outcome=f"{hold_id}:" + "x" * 2000)
    return ids


async def _archive_all(ledger: Ledger, tenant: str) -> int:
    total = 0
    while True:
        done = await archive_settled(ledger, tenant, after_ms=0, keep_restored_ms=0)
        total += done.archived
        if not done.more:
            return total


async def _in_slot(ledger: Ledger, tenant: str, ids: list[str]) -> int:
    return sum([await ledger.redis.exists(hold_key(tenant, h)) for h in ids])


async def test_archived_holds_leave_the_slot_and_read_as_before(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    ids = await _settled(ledger, tenant, 30)
    await ledger.reserve(tenant, "live", "fp", AMOUNT, ttl_ms=HOUR_MS)
    before = {h: await ledger.hold(tenant, h) for h in ids}

    assert await _archive_all(ledger, tenant) == 30
    assert await _in_slot(ledger, tenant, ids) == 0
    assert not await ledger.redis.exists(*(payload_key(tenant, h) for h in ids))
    assert await ledger.redis.hlen(settled_key(tenant)) == 30
    assert await _in_slot(ledger, tenant, ["live"]) == 1  # a live hold stays
    for h in ids:
        assert await ledger.hold(tenant, h) == before[h]
    # Retention follows the hold out: the copy ends when the record would have.
    expiry, dg = await settled_entry(ledger, tenant, ids[0])
    ttl = await ledger.redis.pttl(archive_copy_key(tenant, ids[0], dg))
    assert abs(await ledger.now_ms() + ttl - int(expiry)) <= 100
    assert await _archive_all(ledger, tenant) == 0  # nothing left to take
    report = await audit_tenant(ledger, tenant)
    assert report.mismatches == []


async def test_a_replay_of_an_archived_id_is_a_replay_not_a_second_admission(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    (hold_id,) = await _settled(ledger, tenant, 1)
    first = await ledger.hold(tenant, hold_id)
    assert await _archive_all(ledger, tenant) == 1

    again = await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS)
    assert again.status is Status.EXISTS and again.state is HoldState.POSTED
    with pytest.raises(IdempotencyConflict):
        await ledger.reserve(tenant, hold_id, "other", AMOUNT, ttl_ms=HOUR_MS)
    assert await ledger.hold(tenant, hold_id) == first
    [balance] = [b for b in await ledger.balances(tenant) if b.account == "tenant:acme"]
    assert (balance.pending, balance.posted) == (0, 10)
    reserves = [e async for e in iter_journal(ledger, tenant) if e.op == "reserve"]
    assert len(reserves) == 1
    # The replay brought it back; the next pass takes it out again.
    assert await ledger.redis.zscore(restored_key(tenant), hold_id) is not None
    assert await _archive_all(ledger, tenant) == 1
    assert await ledger.redis.zcard(restored_key(tenant)) == 0


async def test_concurrent_replays_of_archived_ids_admit_nothing(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    ids = await _settled(ledger, tenant, 20)
    await _archive_all(ledger, tenant)
    replays = [
        ledger.reserve(tenant, h, "fp", AMOUNT, ttl_ms=HOUR_MS) for h in ids for _ in range(5)
    ]
    results = await asyncio.gather(*replays)
    assert {r.status for r in results} == {Status.EXISTS}
    reserves = [e async for e in iter_journal(ledger, tenant) if e.op == "reserve"]
    assert len(reserves) == 20


async def test_an_archived_posted_hold_takes_a_compensation(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    (hold_id,) = await _settled(ledger, tenant, 1)
    await _archive_all(ledger, tenant)
    result = await ledger.compensate(tenant, hold_id, 4)
    assert result.status is Status.OK
    hold = await ledger.hold(tenant, hold_id)
    assert hold is not None and hold.compensated["tenant:acme"] == 4
    # Taken out again with its compensation, and read back so.
    assert await _archive_all(ledger, tenant) == 1
    archived = await ledger.hold(tenant, hold_id)
    assert archived is not None and archived.compensated["tenant:acme"] == 4
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_an_unknown_hold_is_still_unknown(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    assert await ledger.hold(tenant, "never") is None
    with pytest.raises(Exception, match="does not exist"):
        await ledger.post(tenant, "never", 1)


async def test_a_hold_changed_after_it_was_read_stays_in_the_slot(
    ledger: Ledger, tenant: str
) -> None:
    """The archiver's copy is of the record it read; a record changed in between
    (here: its fields rewritten as another operation would) does not match the
    copy's digest and stays, so nothing of it is lost."""
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    (hold_id,) = await _settled(ledger, tenant, 1)
    fields, payload = await hold_record(ledger, tenant, hold_id)
    names, dg = digest(fields, payload)
    keys = [
        f"irrev:{{{tenant}}}:accounts",
        settled_key(tenant),
        f"irrev:{{{tenant}}}:archive",
        restored_key(tenant),
        hold_key(tenant, hold_id),
        payload_key(tenant, hold_id),
    ]
    await ledger.redis.hset(hold_key(tenant, hold_id), "note", "changed")
    args = ["", "", "1", hold_id, dg, "0", str(len(names)), *names, "0"]
    assert await ledger._run("archive", keys, args) == [0, 1, 0]
    assert await ledger.redis.exists(hold_key(tenant, hold_id)) == 1


async def test_a_lost_copy_keeps_the_id_taken(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6, agent_a=10**6)
    (hold_id,) = await _settled(ledger, tenant, 1)
    await _archive_all(ledger, tenant)
    _, dg = await settled_entry(ledger, tenant, hold_id)
    await ledger.redis.delete(archive_copy_key(tenant, hold_id, dg))
    with pytest.raises(ArchivedCopyMissing):
        await ledger.reserve(tenant, hold_id, "fp", AMOUNT, ttl_ms=HOUR_MS)
    reserves = [e async for e in iter_journal(ledger, tenant) if e.op == "reserve"]
    assert len(reserves) == 1
