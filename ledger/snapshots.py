"""A Ledger's reads of holds and of each tenant's state: one hold, a page of them, the
ids in a state, the approval queue's order, live counts and /metrics' snapshots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import validate
from .archive import parse_entry, read_copy
from .errors import translate_redis_errors
from .keys import (
    account_fields,
    accounts_key,
    ambiguous_key,
    deadlines_key,
    escalated_key,
    hold_key,
    hold_keys,
    settled_key,
)
from .records import Balance, Hold, HoldState, TenantSnapshot
from .replies import balance_from, decoded, hold_from

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object

HOLD_READS = 3


class Snapshots(LedgerCore):
    """Reads of holds and tenants (a mixin of Ledger)."""

    async def hold(self, tenant: str, hold_id: str) -> Hold | None:
        tenant = validate.tenant_id(tenant)
        record, kept = hold_keys(tenant, validate.identifier("hold_id", hold_id))
        # Two keys, read without a transaction (a cluster pipeline has none): a
        # settlement between the reads would pair a live record with its outcome.
        # One changes the state, so a read whose state held across it is consistent.
        # Not in the slot, the hold may be archived (ledger/archive.py): the index is
        # read in the same pipeline, and when neither has it, both are read again (a
        # restore between the two reads moves it from the index to the slot).
        absent = False
        for _ in range(HOLD_READS):
            with translate_redis_errors("hold"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hgetall(record)
                    pipe.get(kept)
                    pipe.hget(record, "st")
                    pipe.hget(settled_key(tenant), hold_id)
                    fields, payload, state, entry = await pipe.execute()
            if not fields:
                if (at := parse_entry(entry)) is not None:
                    archived = await read_copy(self, tenant, hold_id, at)
                    if archived is None:
                        return None
                    # An empty payload is none (a record of an older release keeps its
                    # outcome in `out` then: hold_from).
                    return hold_from(hold_id, archived[0], archived[1] or None)
                if absent:
                    return None
                absent = True
                continue
            if state == fields["st"]:
                return hold_from(hold_id, fields, payload)
        if not fields:
            return None
        # Moved on under every read: the record, without its payload.
        return hold_from(hold_id, fields, "")

    async def hold_ids(self, tenant: str, state: HoldState) -> list[str]:
        """Ids of the tenant's holds in `state`: indexed for the live states the
        reconciler and the approval queue need, a SCAN for settled ones, which finds
        those still in the tenant's slot (not those archived: ledger/archive.py)."""
        tenant = validate.tenant_id(tenant)
        with translate_redis_errors("hold_ids"):
            if state is HoldState.AMBIGUOUS:
                return sorted(await decoded(self.redis.smembers(ambiguous_key(tenant))))
            if state is HoldState.ESCALATED:
                return sorted(await decoded(self.redis.smembers(escalated_key(tenant))))
            if state is HoldState.PENDING:
                candidates = await decoded(self.redis.zrange(deadlines_key(tenant), 0, -1))
            else:
                start = hold_key(tenant, "")
                scan = self.redis.scan_iter(f"{_glob(start)}*", count=500)
                candidates = [str(k)[len(start) :] async for k in scan]
            result = []
            for hold_id in candidates:
                found = await self.redis.hget(hold_key(tenant, hold_id), "st")
                if found == state.value:
                    result.append(hold_id)
        return sorted(result)

    async def escalation_order(self, tenant: str) -> list[tuple[int, str]]:
        """(created at, hold id) of every escalated hold, oldest first: one small
        field per hold, in one round trip, so that a page of the approval queue reads
        only its own holds' records (and their kept requests)."""
        tenant = validate.tenant_id(tenant)
        ids = await self.hold_ids(tenant, HoldState.ESCALATED)
        with translate_redis_errors("escalation_order"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for hold_id in ids:
                    pipe.hget(hold_key(tenant, hold_id), "t0")
                created = await pipe.execute()
        # A record gone since the set was read: no longer waiting.
        return sorted((int(t0), h) for t0, h in zip(created, ids, strict=True) if t0 is not None)

    async def live_counts(self, tenant: str) -> dict[str, int]:
        """How many holds of the tenant are pending, escalated and ambiguous."""
        tenant = validate.tenant_id(tenant)
        with translate_redis_errors("live_counts"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(deadlines_key(tenant))
                pipe.scard(escalated_key(tenant))
                pipe.scard(ambiguous_key(tenant))
                live, escalated, ambiguous = await pipe.execute()
        return {"pending": live - escalated, "escalated": escalated, "ambiguous": ambiguous}

    async def holds(self, tenant: str, hold_ids: Sequence[str]) -> dict[str, Hold]:
        """The holds of `hold_ids` that exist, by id in the order asked, as `hold`
        reads each, in one pipelined round trip (every key is the tenant's, in one
        slot: one node of a cluster): a page of the approval queue costs one round
        trip, not one per hold. A hold not in the slot (gone, or archived) or whose
        state moved between its reads (a settlement may pair a live record with its
        outcome) is read again on its own."""
        tenant = validate.tenant_id(tenant)
        keys = [hold_keys(tenant, validate.identifier("hold_id", h)) for h in hold_ids]
        with translate_redis_errors("holds"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for record, kept in keys:
                    pipe.hgetall(record)
                    pipe.get(kept)
                    pipe.hget(record, "st")
                replies = await pipe.execute()
        found: dict[str, Hold] = {}
        for at, hold_id in enumerate(hold_ids):
            fields, payload, state = replies[3 * at : 3 * at + 3]
            if fields and state == fields["st"]:
                found[hold_id] = hold_from(hold_id, fields, payload)
            # Gone, archived out of the slot (ledger/archive.py; `hold` reads the
            # index and the slot again, which a racing restore moves it between), or
            # moved on under the read.
            elif (moved := await self.hold(tenant, hold_id)) is not None:
                found[hold_id] = moved
        return found

    async def snapshot(
        self, accounts: Mapping[str, Sequence[str]], *, holds: bool = True
    ) -> list[TenantSnapshot]:
        """Each tenant's TenantSnapshot, for the `accounts` named per tenant, in three
        round trips for all of them (the clock, then two pipelines): the cost grows
        with the accounts named and the escalated and ambiguous holds, never with
        settled holds (for /metrics, read at scrape time). `holds=False`: the live
        counts only, in two round trips and four commands per tenant however many
        holds wait (`escalated` and `ambiguous` are empty): what anyone may scrape
        must not cost a read per hold an agent can make."""
        tenants = [validate.tenant_id(tenant) for tenant in accounts]
        # Not in the pipeline: a cluster pipeline refuses keyless commands such as TIME.
        now_ms = await self.now_ms()
        live = await self._counts_and_balances(tenants, accounts, holds)
        if holds:
            return await self._with_waits(live, now_ms)
        return [
            TenantSnapshot(
                tenant=tenant,
                now_ms=now_ms,
                counts={
                    "pending": count - escalated,
                    "escalated": escalated,
                    "ambiguous": ambiguous,
                },
                balances=balances,
                escalated=[],
                ambiguous=[],
            )
            for tenant, count, escalated, ambiguous, balances in live
        ]

    async def _counts_and_balances(
        self, tenants: list[str], accounts: Mapping[str, Sequence[str]], holds: bool
    ) -> list[tuple[str, int, Any, Any, list[Balance]]]:
        """Per tenant, in one pipeline: how many holds are live, its escalated and
        ambiguous holds (their sorted ids; with `holds=False` how many), and the
        balances of those of its named accounts that exist."""
        with translate_redis_errors("snapshot"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.zcard(deadlines_key(tenant))
                    if holds:
                        pipe.smembers(escalated_key(tenant))
                        pipe.smembers(ambiguous_key(tenant))
                    else:
                        pipe.scard(escalated_key(tenant))
                        pipe.scard(ambiguous_key(tenant))
                    for account in accounts[tenant]:
                        pipe.hmget(accounts_key(tenant), account_fields(account))
                replies = iter(await pipe.execute())
        read = []
        for tenant in tenants:
            live, escalated, ambiguous = next(replies), next(replies), next(replies)
            balances = [
                balance_from(account, values)
                for account, values in zip(accounts[tenant], replies, strict=False)
                if values[0] is not None
            ]
            if holds:
                escalated, ambiguous = sorted(escalated), sorted(ambiguous)
            read.append((tenant, live, escalated, ambiguous, balances))
        return read

    async def _with_waits(
        self, live: list[tuple[str, int, Any, Any, list[Balance]]], now_ms: int
    ) -> list[TenantSnapshot]:
        """The snapshots of the tenants `live` read, with when each escalated hold was
        asked for and is due, and when each ambiguous one was (one more pipeline)."""
        with translate_redis_errors("snapshot"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant, _, escalated, ambiguous, _ in live:
                    for hold_id in escalated + ambiguous:
                        pipe.hmget(hold_key(tenant, hold_id), ("t0", "dl"))
                times = iter(await pipe.execute())
        snapshots = []
        for tenant, count, escalated, ambiguous, balances in live:
            queued = [next(times) for _ in escalated]
            doubtful = [next(times) for _ in ambiguous]
            counts = {
                "pending": count - len(escalated),
                "escalated": len(escalated),
                "ambiguous": len(ambiguous),
            }
            snapshots.append(
                TenantSnapshot(
                    tenant=tenant,
                    now_ms=now_ms,
                    counts=counts,
                    balances=balances,
                    escalated=[(int(t0), int(dl)) for t0, dl in queued if t0 is not None],
                    ambiguous=[int(t0) for t0, _ in doubtful if t0 is not None],
                )
            )
        return snapshots


def _glob(text: str) -> str:
    """Escape glob metacharacters (the hash tag's braces are literal in a pattern)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
