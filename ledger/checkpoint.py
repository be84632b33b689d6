"""Trimming a tenant's journal without losing it: entries older than a cut-off are
appended to an archive file (JSON lines, fsynced) first, then a checkpoint of the
balances they add up to replaces them in Redis, in one optimistic transaction with
the trim. Audit replays checkpoint + remaining entries, so it still checks every
balance; the archive plus the stream is the whole history.

A trimmer can die between the archive and the transaction; the next trim reads the
same entries again, so the archive appends only entries past the last one it holds
(under a file lock, so that processes sharing a directory write each entry once).
Gateways trim on a timer through `trim_locked`: one trimmer per tenant at a time."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from redis import exceptions as redis_errors

from . import validate
from .client import Ledger
from .errors import CheckpointMoved, translate_redis_errors
from .journal import JournalEntry, Replay, entry_order, iter_journal
from .keys import checkpoint_key, journal_key, trim_lock_key

# Entries per archive-and-trim pass: bounds the memory of one pass, and how long the
# checkpoint document takes to build, however far behind the trimming is.
TRIM_BATCH = 10_000
TRIM_LOCK_S = 300
# The largest sequence number a stream id can carry within one millisecond.
LAST_SEQ = 2**64 - 1


@dataclass(frozen=True)
class Checkpoint:
    upto: str  # the last entry the checkpoint includes ('-' for none)
    replay: Replay


async def load_checkpoint(ledger: Ledger, tenant: str) -> Checkpoint:
    with translate_redis_errors("reading the checkpoint"):
        raw = await ledger.redis.get(checkpoint_key(tenant))
    if raw is None:
        return Checkpoint("-", Replay())
    data = json.loads(raw)
    return Checkpoint(data["upto"], Replay.from_state(data["state"]))


async def replay_from_checkpoint(ledger: Ledger, tenant: str) -> Replay:
    """The checkpoint plus every entry after it. A trim between reading the one and
    the other would skip entries, so a moved checkpoint means reading again."""
    for _ in range(5):
        checkpoint = await load_checkpoint(ledger, tenant)
        replayed = checkpoint.replay
        async for entry in iter_journal(ledger, tenant, after=checkpoint.upto):
            replayed.apply(entry)
        if (await load_checkpoint(ledger, tenant)).upto == checkpoint.upto:
            return replayed
    raise CheckpointMoved(f"the journal of {tenant} kept being trimmed during the replay")


async def cutoff_ms(ledger: Ledger, older_than_s: int) -> int:
    """Redis's clock minus `older_than_s`: journal entry ids carry Redis time."""
    return await ledger.now_ms() - older_than_s * 1000


def archive_path(archive_dir: Path, tenant: str) -> Path:
    return archive_dir / f"{tenant}.journal.jsonl"


def _last_archived(out: IO[bytes]) -> tuple[int, int] | None:
    """The order of the file's last complete entry. A torn last line (a writer killed
    mid-line, before its trim could commit, so Redis still has the entry) is cut off."""
    end = out.seek(0, os.SEEK_END)
    position, tail = end, b""
    while position > 0 and tail.count(b"\n") < 2:
        step = min(4096, position)
        position -= step
        out.seek(position)
        tail = out.read(step) + tail
    complete = tail.rfind(b"\n") + 1
    if position + complete < end:
        out.truncate(position + complete)
    lines = tail[:complete].splitlines()
    return entry_order(json.loads(lines[-1])["id"]) if lines else None


def _archive(path: Path, entries: list[JournalEntry]) -> int:
    """Append the entries the archive does not hold yet; returns how many."""
    created = not path.exists()
    with open(path, "a+b") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        last = _last_archived(out)
        fresh = [e for e in entries if last is None or entry_order(e.entry_id) > last]
        out.seek(0, os.SEEK_END)
        out.write(
            b"".join(json.dumps(e.as_dict(), separators=(",", ":")).encode() + b"\n" for e in fresh)
        )
        out.flush()
        os.fsync(out.fileno())
    if created:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return len(fresh)


async def trim(
    ledger: Ledger, tenant: str, archive_dir: Path, before_ms: int, *, batch: int = TRIM_BATCH
) -> int:
    """Archive and trim the entries of `tenant` older than `before_ms` (server time
    of the entry ids), `batch` at a time; returns how many were trimmed."""
    validate.tenant_id(tenant)
    total = 0
    while True:
        count = await _trim_batch(ledger, tenant, archive_dir, before_ms, batch)
        total += count
        if count < batch:
            return total


async def trim_locked(ledger: Ledger, tenant: str, archive_dir: Path, before_ms: int) -> int | None:
    """`trim`, unless another process is trimming this tenant or moved its checkpoint
    first (then None). The lock only saves work: correctness rests on the archive's
    dedup and the checkpoint's optimistic transaction, so a lock that expires mid-trim
    loses nothing."""
    lock = ledger.redis.lock(trim_lock_key(tenant), timeout=TRIM_LOCK_S, blocking=False)
    with translate_redis_errors("taking the trim lock"):
        if not await lock.acquire():
            return None
    try:
        return await trim(ledger, tenant, archive_dir, before_ms)
    except CheckpointMoved:
        return None
    finally:
        # A lock that expired (and perhaps went to another trimmer) is safe to lose.
        with (
            translate_redis_errors("releasing the trim lock"),
            contextlib.suppress(redis_errors.LockError),
        ):
            await lock.release()


async def _trim_batch(
    ledger: Ledger, tenant: str, archive_dir: Path, before_ms: int, batch: int
) -> int:
    checkpoint = await load_checkpoint(ledger, tenant)
    entries: list[JournalEntry] = []
    # Strictly older than `before_ms`: the last possible id of the millisecond before
    # (an id `{before_ms}-0` would cut that millisecond's entries in two).
    last = f"{before_ms - 1}-{LAST_SEQ}"
    async for entry in iter_journal(ledger, tenant, after=checkpoint.upto, upto=last):
        entries.append(entry)
        if len(entries) == batch:
            break
    if not entries:
        return 0
    archive_dir.mkdir(parents=True, exist_ok=True)
    # fsync off the event loop: a gateway trims while it serves admissions.
    await asyncio.to_thread(_archive, archive_path(archive_dir, tenant), entries)
    replayed = checkpoint.replay
    for entry in entries:
        replayed.apply(entry)
    upto = entries[-1].entry_id
    document: dict[str, Any] = {"upto": upto, "state": replayed.state()}
    await _swap(ledger, tenant, checkpoint.upto, upto, json.dumps(document))
    return len(entries)


async def _swap(ledger: Ledger, tenant: str, expected: str, upto: str, document: str) -> None:
    """Replace the checkpoint and trim the stream together, unless another trim moved
    the checkpoint meanwhile. An entry whose replay is not yet in the checkpoint is
    never trimmed: the archive is written first, then this transaction."""
    key = checkpoint_key(tenant)
    with translate_redis_errors("writing the checkpoint"):
        try:
            async with ledger.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                current = await pipe.get(key)
                if (json.loads(current)["upto"] if current else "-") != expected:
                    raise CheckpointMoved(f"another trim of {tenant} ran first; try again")
                pipe.multi()
                pipe.set(key, document)
                ms, _, seq = upto.partition("-")
                pipe.xtrim(journal_key(tenant), minid=f"{ms}-{int(seq) + 1}", approximate=False)
                await pipe.execute()
        except redis_errors.WatchError as exc:
            raise CheckpointMoved(f"another trim of {tenant} ran first; try again") from exc
