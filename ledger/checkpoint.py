"""Trimming a tenant's journal without losing it: entries older than a cut-off are
appended to an archive file (JSON lines, fsynced) first, then a checkpoint of the
balances they add up to replaces them in Redis, in one optimistic transaction with
the trim. Audit replays checkpoint + remaining entries, so it still checks every
balance; the archive plus the stream is the whole history."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from .errors import LedgerError, LedgerUnavailable
from .journal import JournalEntry, Replay, iter_journal
from .keys import checkpoint_key, journal_key


class CheckpointMoved(LedgerError):
    """Another trim of the same tenant ran at the same time; nothing was trimmed."""


@dataclass(frozen=True)
class Checkpoint:
    upto: str  # the last entry the checkpoint includes ('-' for none)
    replay: Replay


async def load_checkpoint(redis: Redis, tenant: str) -> Checkpoint:
    try:
        raw = await redis.get(checkpoint_key(tenant))
    except redis_errors.RedisError as exc:
        raise LedgerUnavailable(f"could not read the checkpoint: {exc}") from exc
    if raw is None:
        return Checkpoint("-", Replay())
    data = json.loads(raw)
    return Checkpoint(data["upto"], Replay.from_state(data["state"]))


async def replay_from_checkpoint(redis: Redis, tenant: str) -> Replay:
    """The checkpoint plus every entry after it. A trim between reading the one and
    the other would skip entries, so a moved checkpoint means reading again."""
    for _ in range(5):
        checkpoint = await load_checkpoint(redis, tenant)
        replayed = checkpoint.replay
        async for entry in iter_journal(redis, tenant, after=checkpoint.upto):
            replayed.apply(entry)
        if (await load_checkpoint(redis, tenant)).upto == checkpoint.upto:
            return replayed
    raise CheckpointMoved(f"the journal of {tenant} kept being trimmed during the replay")


def _archive(path: Path, entries: list[JournalEntry]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        for entry in entries:
            out.write(json.dumps(entry.as_dict(), separators=(",", ":")) + "\n")
        out.flush()
        os.fsync(out.fileno())


async def trim(redis: Redis, tenant: str, archive_dir: Path, before_ms: int) -> int:
    """Archive and trim the entries of `tenant` older than `before_ms` (server time
    of the entry ids); returns how many were trimmed."""
    checkpoint = await load_checkpoint(redis, tenant)
    entries = [
        entry
        async for entry in iter_journal(redis, tenant, after=checkpoint.upto, upto=f"{before_ms}-0")
    ]
    if not entries:
        return 0
    archive_dir.mkdir(parents=True, exist_ok=True)
    _archive(archive_dir / f"{tenant}.journal.jsonl", entries)
    replayed = checkpoint.replay
    for entry in entries:
        replayed.apply(entry)
    upto = entries[-1].entry_id
    document: dict[str, Any] = {"upto": upto, "state": replayed.state()}
    await _swap(redis, tenant, checkpoint.upto, upto, json.dumps(document))
    return len(entries)


async def _swap(redis: Redis, tenant: str, expected: str, upto: str, document: str) -> None:
    """Replace the checkpoint and trim the stream together, unless another trim moved
    the checkpoint meanwhile. An entry whose replay is not yet in the checkpoint is
    never trimmed: the archive is written first, then this transaction."""
    key = checkpoint_key(tenant)
    try:
        async with redis.pipeline(transaction=True) as pipe:
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
    except redis_errors.RedisError as exc:
        raise LedgerUnavailable(f"could not write the checkpoint: {exc}") from exc
