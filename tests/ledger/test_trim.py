"""Trimming under contention and crashes: the archive ends up holding every trimmed
entry exactly once, whatever the trimmers race or die doing, and archive + stream is
the whole history. Real processes, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ledger.audit import audit_tenant
from ledger.checkpoint import archive_path, load_checkpoint, trim, trim_locked
from ledger.client import Ledger
from ledger.journal import JournalEntry, iter_journal
from ledger.keys import trim_lock_key
from ledger.records import ReserveRequest

from .conftest import open_accounts
from .test_concurrency import finish, release, spawn

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

FAR_FUTURE_MS = 2**52
HOUR_MS = 3_600_000


async def busy_journal(ledger: Ledger, tenant: str, holds: int) -> list[JournalEntry]:
    """`holds` reserves and as many posts (plus the accounts' own entries); returns the
    whole journal."""
    await open_accounts(ledger, tenant, tenant_acme=10**12, agent_a=10**12)
    for start in range(0, holds, 500):
        ids = [f"h{i}" for i in range(start, min(start + 500, holds))]
        amounts = {"tenant:acme": 10, "agent:a": 10}
        await ledger.reserve_many(
            tenant,
            [
                ReserveRequest(idempotency_key=k, fingerprint="fp", amounts=amounts, ttl_ms=HOUR_MS)
                for k in ids
            ],
        )
        await ledger.post_many(tenant, [(k, 4) for k in ids])
    return [entry async for entry in iter_journal(ledger, tenant)]


def archived_ids(archive_dir: Path, tenant: str) -> list[str]:
    lines = archive_path(archive_dir, tenant).read_bytes().splitlines()
    return [json.loads(line)["id"] for line in lines]


async def test_racing_trimmers_archive_each_entry_once(
    ledger: Ledger, tenant: str, redis_url: str, tmp_path: Path
) -> None:
    history = await busy_journal(ledger, tenant, 1500)
    name = f"{tenant}:barrier"
    workers = [spawn("trim", redis_url, tenant, name, str(tmp_path), "97") for _ in range(4)]
    await release(ledger, name, len(workers))
    results = finish(workers)

    assert archived_ids(tmp_path, tenant) == [e.entry_id for e in history]
    assert [e async for e in iter_journal(ledger, tenant)] == []
    assert (await load_checkpoint(ledger, tenant)).upto == history[-1].entry_id
    assert sum(int(r["moved"]) for r in results) > 0  # they did race
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


async def test_trimmer_killed_between_archive_and_checkpoint(
    ledger: Ledger, tenant: str, redis_url: str, tmp_path: Path
) -> None:
    history = await busy_journal(ledger, tenant, 6000)
    name = f"{tenant}:barrier"
    worker = spawn("trim", redis_url, tenant, name, str(tmp_path), "100000")
    await release(ledger, name, 1)
    archive = archive_path(tmp_path, tenant)
    deadline = time.monotonic() + 60
    while not (archive.exists() and archive.stat().st_size > 0):
        assert time.monotonic() < deadline, "the trimmer never wrote its archive"
        time.sleep(0.0005)
    os.kill(worker.pid, signal.SIGKILL)
    worker.communicate(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    # Killed after its archive, before the checkpoint replaced those entries in Redis.
    assert (await load_checkpoint(ledger, tenant)).upto == "-"
    assert len([e async for e in iter_journal(ledger, tenant)]) == len(history)

    assert await trim(ledger, tenant, tmp_path, FAR_FUTURE_MS) == len(history)
    assert archived_ids(tmp_path, tenant) == [e.entry_id for e in history]
    assert (await audit_tenant(ledger, tenant)).ok


async def test_torn_last_archive_line_is_replaced(
    ledger: Ledger, tenant: str, tmp_path: Path
) -> None:
    history = await busy_journal(ledger, tenant, 20)
    archive = archive_path(tmp_path, tenant)
    whole = [json.dumps(e.as_dict(), separators=(",", ":")) for e in history[:5]]
    # What a writer killed mid-line leaves behind: five whole lines, half of the sixth.
    archive.write_text("\n".join(whole) + "\n" + json.dumps(history[5].as_dict())[:17])

    assert await trim(ledger, tenant, tmp_path, FAR_FUTURE_MS) == len(history)
    assert archived_ids(tmp_path, tenant) == [e.entry_id for e in history]
    assert archive.read_bytes().endswith(b"\n")


async def test_trim_locked_leaves_a_held_tenant_alone(
    ledger: Ledger, tenant: str, tmp_path: Path
) -> None:
    history = await busy_journal(ledger, tenant, 10)
    await ledger.redis.set(trim_lock_key(tenant), "someone-else", px=60_000)
    assert await trim_locked(ledger, tenant, tmp_path, FAR_FUTURE_MS) is None
    assert not archive_path(tmp_path, tenant).exists()

    await ledger.redis.delete(trim_lock_key(tenant))
    assert await trim_locked(ledger, tenant, tmp_path, FAR_FUTURE_MS) == len(history)
    assert await ledger.redis.exists(trim_lock_key(tenant)) == 0
