"""Settled holds out of the tenant's slot: archived copies in other slots, an index
entry in the slot, and a restore for the rare call that acts on one again.

A Redis Cluster moves a slot key by key, and while it moves, a script whose keys are
not all on one node is refused (TRYAGAIN). A new hold's keys exist on neither node, so
a tenant's reserves wait for the whole move. Settled holds kept for their retention
(7 days by default) made the slot hundreds of thousands of keys and the move minutes
long. The archiver (run by the gateway's sweeper, or `irrev ledger archive`) copies
each hold settled more than `after_ms` ago to a key of its own slot, waits for the
ledger's replicas and fsync as a reserve does, then takes it out of the tenant's slot
in lua/archive.lua, which leaves an index entry (`<expiry>|<digest>`) in the slot's
settled index. The slot keeps live holds, accounts and a few tenant-wide keys.

What still finds an archived hold:
- a reserve (or attach) of its id: answered 'archived' by its script, the hold is
  restored and the call made again, which replays it: an id is never admitted twice
  while its retention lasts;
- any other operation on it (a compensation, a true-up, a note): answered
  'not_found' by its script, it is restored and the call made again;
- Ledger.hold: read from the copy, without restoring it.

A copy is named by the digest of the record it holds, so no copy is ever written over
(two archivers racing write two copies; the one the index names is the one taken
out); lua/archive.lua takes a hold out only if its record still has that digest.
Copies expire when the hold's retention ends; the index entries are dropped by the
archiver's scan once it has. With no waits configured a failover can lose a copy
whose hold already left the slot: its id stays taken (ArchivedCopyMissing), never
admitted again.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import validate
from .errors import BadInput, LedgerError, translate_redis_errors
from .keys import (
    ARCHIVED_PAYLOAD,
    accounts_key,
    archive_bucket,
    archive_copy_key,
    archive_state_key,
    hold_key,
    journal_key,
    payload_key,
    restored_key,
    settled_key,
)
from .release import ARCHIVED_HOLDS

if TYPE_CHECKING:
    # All this module asks of a Ledger: its connection and shared call path, which
    # its families (holds, snapshots) call it with.
    from .client import LedgerCore as Ledger

# Holds looked at per pass (and per script call): a pass is one script in the
# tenant's slot, which must stay short.
ARCHIVE_BATCH = 200
# How long after it settled a hold stays in the slot: most replays of an effect come
# within seconds of it, and are then answered from the slot.
ARCHIVE_AFTER_MS = 60_000
SETTLED_STATES = frozenset({"posted", "voided", "rejected", "expired", "denied"})
# How many times a call restores a hold and tries again before it gives up.
RESTORE_TRIES = 3
# A restored hold stays in the slot at least this long, whatever `after_ms`: the call
# that restored it makes its call again within it (an archiver at after_ms 0 took it
# out again in between, three times running, on the cluster).
RESTORED_KEEP_MS = 5_000


UPGRADE_FIRST = (
    "the fleet's release flag says a gateway of an older release may still serve, whose "
    "reserve would admit an archived hold's id again: run `irrev ledger upgrade finish` "
    "once every gateway runs this release"
)


class ArchivedCopyMissing(LedgerError):
    """A hold's index entry names a copy that is gone before its retention ended (a
    failover lost it, or something deleted it): its id stays taken."""

    def __init__(self, tenant: str, hold_id: str) -> None:
        super().__init__(
            f"hold {hold_id!r} of tenant {tenant!r} was settled and archived, and its archived "
            "copy is missing: the id stays used and nothing is done with it; the journal "
            "says what became of it (`irrev ledger journal`), and only an effect that did not "
            "happen may be asked for again, under a new idempotency key"
        )
        self.tenant = tenant
        self.hold_id = hold_id


@dataclass(frozen=True, slots=True)
class ArchivePass:
    """What one pass did: holds taken out of the slot, holds left because they
    changed (or were not settled) since they were read, index entries dropped whose
    retention is over, and whether more are waiting for another pass."""

    archived: int
    changed: int
    trimmed: int
    more: bool
    # Why nothing was looked at ('' when the pass ran).
    held_back: str = ""


def digest(fields: Mapping[str, str], payload: str) -> tuple[list[str], str]:
    """The record's field names in digest order and its digest (the first 16 hex
    digits of a SHA-1 over each field as `<len>:<name><len>:<value>`, then the payload
    as `<len>:<payload>`, lengths in bytes): what lua/archive.lua and lua/restore.lua
    compute from the same names."""
    names = sorted(fields)
    parts = [_part(name) + _part(fields[name]) for name in names]
    parts.append(_part(payload))
    return names, hashlib.sha1("".join(parts).encode()).hexdigest()[:16]


def _part(text: str) -> str:
    return f"{len(text.encode())}:{text}"


async def archive_settled(
    ledger: Ledger,
    tenant: str,
    *,
    after_ms: int = ARCHIVE_AFTER_MS,
    batch: int = ARCHIVE_BATCH,
    keep_restored_ms: int = RESTORED_KEEP_MS,
) -> ArchivePass:
    """One pass over the tenant's journal (from where the last pass stopped) and its
    restored holds: each hold settled more than `after_ms` ago is copied out and taken
    out of the slot; a page of the settled index is scanned for entries whose retention
    is over. A hold restored less than `keep_restored_ms` ago stays. Nothing while the
    fleet's release flag says an older release may serve (the pass's `held_back` says
    so)."""
    tenant = validate.tenant_id(tenant)
    if not 1 <= batch <= 1000:
        raise BadInput("batch", "must be an integer in [1, 1000]")
    if not ledger.release.reads(ARCHIVED_HOLDS):
        # An older release's reserve does not look in the settled index.
        return ArchivePass(0, 0, 0, False, UPGRADE_FIRST)
    now = await ledger.now_ms()
    ripe = now - validate.amount("after_ms", after_ms)
    seen = await _look(ledger, tenant, ripe, min(ripe, now - keep_restored_ms), batch)
    restored = [hold_id for hold_id, _ in seen.restored_at]
    ids = list(dict.fromkeys([*(f["hold"] for _, f in seen.entries if f.get("hold")), *restored]))
    records = await _read(ledger, tenant, ids, now, now - keep_restored_ms)
    found = {r[0] for r in records}
    ripe_records = [r for r in records if _settled_by(r[1]) <= ripe]
    kept = await _copy(ledger, tenant, ripe_records)
    # Holds whose copies were not acknowledged stay in the slot, and the journal is
    # read from where it was next time: past them, no pass would look at them again.
    held = len(kept) < len(ripe_records)
    expired = [
        (hold_id, entry)
        for hold_id, entry in seen.page.items()
        if 0 < int(entry.split("|", 1)[0]) <= now
    ]
    # Restored holds whose retention ended in the slot: out of the restored set.
    gone = [(hold_id, at) for hold_id, at in seen.restored_at if hold_id not in found]
    if not (seen.entries or kept or expired or gone) and seen.scan_at == seen.scanned_from:
        # An idle tenant: nothing to write, and no script run for it every round.
        return ArchivePass(0, 0, 0, False)
    read_to = seen.entries[-1][0] if seen.entries and not held else ""
    keys, args = _archive_call(tenant, read_to, seen.scan_at, kept, expired, gone)
    reply = await ledger._run("archive", keys, args)
    if reply[0] == "bad_input":
        raise BadInput(str(reply[1]), str(reply[2]))
    archived, changed, trimmed = (int(x) for x in reply)
    more = len(seen.entries) == batch or len(restored) == batch
    return ArchivePass(archived, changed, trimmed, more and not held)


@dataclass(frozen=True, slots=True)
class _Look:
    """What a pass reads before it decides: the journal entries since the last pass
    up to `ripe`, the holds restored long enough ago with when, and a page of the
    settled index (`scanned_from` the cursor it was read at, `scan_at` the next)."""

    entries: list[tuple[str, dict[str, str]]]
    restored_at: list[tuple[str, float]]
    page: dict[str, str]
    scanned_from: str
    scan_at: str


async def _look(ledger: Ledger, tenant: str, ripe: int, restored_before: int, batch: int) -> _Look:
    # Read with decode_responses (Ledger.from_url): text, whatever redis-py's types say.
    redis: Any = ledger.redis
    with translate_redis_errors("archive"):
        read, trim = await redis.hmget(archive_state_key(tenant), ["journal", "trim"])
        start = f"({read}" if read else "-"
        entries = await redis.xrange(journal_key(tenant), start, str(max(ripe, 0)), count=batch)
        restored_at = await redis.zrangebyscore(
            restored_key(tenant), "-inf", restored_before, 0, batch, withscores=True
        )
        scan_at, page = await redis.hscan(settled_key(tenant), int(trim or 0), count=batch)
    return _Look(entries, restored_at, page, str(trim or 0), str(scan_at))


def _archive_call(
    tenant: str,
    read_to: str,
    scan_at: str,
    kept: list[tuple[str, dict[str, str], str, int]],
    expired: list[tuple[str, str]],
    gone: list[tuple[str, float]],
) -> tuple[list[str], list[str]]:
    """The keys and arguments of lua/archive.lua: the journal position the pass read
    to ('' to read again from where it was), the settled index's next cursor, the
    copied holds to take out, the index entries to drop and the restored holds to
    forget."""
    keys = [accounts_key(tenant), settled_key(tenant), archive_state_key(tenant)]
    keys.append(restored_key(tenant))
    args = [read_to, scan_at, str(len(kept))]
    for hold_id, fields, payload, expiry in kept:
        names, dg = digest(fields, payload)
        keys += [hold_key(tenant, hold_id), payload_key(tenant, hold_id)]
        args += [hold_id, dg, str(expiry), str(len(names)), *names]
    args.append(str(len(expired)))
    for hold_id, entry in expired:
        args += [hold_id, entry]
    args.append(str(len(gone)))
    for hold_id, at in gone:
        args += [hold_id, str(int(at))]
    return keys, args


def _settled_by(fields: Mapping[str, str]) -> int:
    """When the hold settled (Redis time): posted (tp), ended otherwise (te), or
    denied at its reserve (t0)."""
    return int(fields.get("tp") or fields.get("te") or fields["t0"])


async def _read(
    ledger: Ledger, tenant: str, ids: list[str], now: int, restored_by: int
) -> list[tuple[str, dict[str, str], str, int]]:
    """(id, record, payload, expiry) of each of `ids` that is settled in the slot and
    was not restored after `restored_by`; expiry is Redis time its retention ends (0:
    kept for good)."""
    if not ids:
        return []
    with translate_redis_errors("archive"):
        async with ledger.redis.pipeline(transaction=False) as pipe:
            for hold_id in ids:
                pipe.hgetall(hold_key(tenant, hold_id))
                pipe.get(payload_key(tenant, hold_id))
                pipe.pttl(hold_key(tenant, hold_id))
                pipe.zscore(restored_key(tenant), hold_id)
            replies = await pipe.execute()
    found = []
    for i, hold_id in enumerate(ids):
        fields, payload, ttl, restored = replies[4 * i : 4 * i + 4]
        if fields.get("st") not in SETTLED_STATES or ttl == -2:
            continue
        if restored is not None and restored > restored_by:
            continue
        found.append((hold_id, fields, payload or "", now + ttl if ttl > 0 else 0))
    return found


async def _copy(
    ledger: Ledger, tenant: str, records: list[tuple[str, dict[str, str], str, int]]
) -> list[tuple[str, dict[str, str], str, int]]:
    """Write each record's copy, one pipeline per archive slot followed by the
    ledger's waits; the records whose copy was written and acknowledged as a reserve
    would be (the others stay in the slot for a later pass)."""
    by_slot: dict[int, list[tuple[str, dict[str, str], str, int]]] = defaultdict(list)
    for record in records:
        by_slot[archive_bucket(record[0])].append(record)
    kept = []
    for group in by_slot.values():
        commands: list[tuple[Any, ...]] = []
        for hold_id, fields, payload, expiry in group:
            key = archive_copy_key(tenant, hold_id, digest(fields, payload)[1])
            flat = [x for pair in fields.items() for x in pair]
            commands.append(("HSET", key, *flat, ARCHIVED_PAYLOAD, payload))
            commands.append(("PEXPIREAT", key, expiry) if expiry else ("PERSIST", key))
        with translate_redis_errors("archive"):
            replies, answers = await ledger.pipeline(commands, commands[0][1])
        if not ledger.acknowledged(answers):
            continue
        for i, record in enumerate(group):
            if not any(isinstance(r, Exception) for r in replies[2 * i : 2 * i + 2]):
                kept.append(record)
    return kept


async def read_archived(
    ledger: Ledger, tenant: str, hold_id: str
) -> tuple[dict[str, str], str] | None:
    """The record and payload of an archived hold, read from its copy (None: the id
    has no index entry, or its retention is over)."""
    entry = await _entry(ledger, tenant, hold_id)
    return None if entry is None else await read_copy(ledger, tenant, hold_id, entry)


async def read_copy(
    ledger: Ledger, tenant: str, hold_id: str, entry: tuple[int, str]
) -> tuple[dict[str, str], str] | None:
    """The record and payload of the copy that index entry `entry` (expiry, digest)
    names (None: its retention is over). A copy is never written over, so what the
    entry named when it was read is what this reads, whatever moved since."""
    expiry, dg = entry
    redis: Any = ledger.redis
    with translate_redis_errors("hold"):
        copy = await redis.hgetall(archive_copy_key(tenant, hold_id, dg))
    if not copy:
        if expiry and expiry <= await ledger.now_ms():
            return None
        raise ArchivedCopyMissing(tenant, hold_id)
    payload = copy.pop(ARCHIVED_PAYLOAD, "")
    return copy, payload


async def restore(ledger: Ledger, tenant: str, hold_id: str) -> bool:
    """Bring an archived hold back into the tenant's slot; whether it is there now
    (False: the id has no hold, or its retention is over)."""
    for _ in range(RESTORE_TRIES):
        entry = await _entry(ledger, tenant, hold_id)
        # The copy of the entry read: read again, the index may name a newer copy
        # (restored, changed and archived again meanwhile), not the record of `entry`.
        found = None if entry is None else await read_copy(ledger, tenant, hold_id, entry)
        if entry is None or found is None:
            break  # not archived, or no longer (a racing call restored it)
        fields, payload = found
        names, dg = digest(fields, payload)
        if dg != entry[1]:
            raise ArchivedCopyMissing(tenant, hold_id)  # a copy that is not its record
        keys = [accounts_key(tenant), settled_key(tenant), restored_key(tenant)]
        keys += [hold_key(tenant, hold_id), payload_key(tenant, hold_id)]
        flat = [x for name in names for x in (name, fields[name])]
        reply = await ledger._run("restore", keys, [hold_id, dg, str(len(names)), *flat, payload])
        status = str(reply[0])
        if status in ("restored", "live"):
            return True
        if status == "expired":
            return False
        if status == "bad_input":
            raise BadInput(str(reply[1]), str(reply[2]))
    with translate_redis_errors("hold"):
        return bool(await ledger.redis.exists(hold_key(tenant, hold_id)))


async def _entry(ledger: Ledger, tenant: str, hold_id: str) -> tuple[int, str] | None:
    """(expiry, digest) of the id's index entry, if it has one."""
    redis: Any = ledger.redis
    with translate_redis_errors("hold"):
        return parse_entry(await redis.hget(settled_key(tenant), hold_id))


def parse_entry(entry: str | None) -> tuple[int, str] | None:
    """(expiry, digest) of an index entry as read (None: no entry)."""
    if not entry:
        return None
    expiry, dg = str(entry).split("|", 1)
    return int(expiry), dg
