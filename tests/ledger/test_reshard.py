"""A busy tenant's slot moved to another primary while its agents write, with more
than 100,000 settled holds of the tenant in retention: archived out of the slot
(ledger/archive.py), they stay where they are, and the slot holds only live holds,
the accounts and a few tenant-wide keys, so its writes stop for about as long as a
handful of keys take to move. Its journal is trimmed first, as a gateway with
IRREV_JOURNAL_KEEP_S does (docs/operations.md, "Resharding a tenant's slot").

Checked: no write gap over 1 s for any writer, no archived id admitted again by the
replayer (which brings archived holds back mid-move), no account opened twice, and
the audit (balances equal to the journal's replay from its checkpoint) clean."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from irrev.localcluster import LocalCluster
from ledger import ReserveRequest, archive_settled
from ledger.audit import audit_tenant
from ledger.checkpoint import replay_from_checkpoint, trim
from ledger.client import Ledger
from ledger.journal import iter_journal
from ledger.keys import accounts_key
from ledger.records import ReserveResult, TransitionResult

from .conftest import open_accounts
from .test_cluster import _primaries
from .test_concurrency import release, spawn

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000
SETTLED = 100_000
BATCH = 1000
WRITERS = 3


async def _settle_many(ledger: Ledger, tenant: str) -> None:
    """SETTLED holds `old-<i>` reserved and posted, BATCH to a round trip."""
    amounts = {"tenant:acme": 5, "agent:old": 5}
    for start in range(0, SETTLED, BATCH):
        keys = [f"old-{i}" for i in range(start, start + BATCH)]
        reserved = await ledger.reserve_many(
            tenant,
            [
                ReserveRequest(idempotency_key=k, fingerprint="fp", amounts=amounts, ttl_ms=HOUR_MS)
                for k in keys
            ],
        )
        assert all(isinstance(r, ReserveResult) and r.decision == "admit" for r in reserved), (
            reserved[:3]
        )
        posted = await ledger.post_many(tenant, [(k, 5) for k in keys])
        assert all(isinstance(p, TransitionResult) and p.state.value == "posted" for p in posted), (
            posted[:3]
        )


async def test_a_busy_tenant_with_100k_settled_holds_moves_without_a_write_gap(
    redis_cluster: LocalCluster, tenant: str, tmp_path: Path
) -> None:
    ledger = Ledger.from_url(redis_cluster.url)
    key = accounts_key(tenant)
    try:
        await open_accounts(ledger, tenant, tenant_acme=10**12, agent_old=10**12)
        for w in range(WRITERS):
            await open_accounts(ledger, tenant, **{f"agent_w{w}": 10**12})
        started = time.monotonic()
        await _settle_many(ledger, tenant)
        filled = time.monotonic() - started
        started = time.monotonic()
        archived = 0
        while True:
            done = await archive_settled(ledger, tenant, after_ms=0, batch=BATCH)
            archived += done.archived
            if not done.more:
                break
        emptied = time.monotonic() - started
        assert archived == SETTLED
        trimmed = await trim(ledger, tenant, tmp_path, await ledger.now_ms() + 1)
        source = redis_cluster.primary_for(key)
        with source.client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            in_slot = int(client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
        assert in_slot < 20, f"{in_slot} keys left in the tenant's slot"

        name = f"{tenant}:barrier"
        stop = f"{tenant}:stop"
        writers = [
            spawn("writes", redis_cluster.url, tenant, name, f"w{w}", stop) for w in range(WRITERS)
        ]
        replayer = spawn("replay", redis_cluster.url, tenant, name, "old", "200", "5")
        workers = [*writers, replayer]
        await release(ledger, name, len(workers))
        for writer in writers:  # under way before the move
            assert writer.stdout is not None and writer.stdout.readline()
        target = next(
            n
            for n in redis_cluster.nodes
            if n is not source and n.port in _primaries(redis_cluster)
        )
        started = time.monotonic()
        moved = await asyncio.to_thread(redis_cluster.migrate_slot, key, target, per_batch=10)
        migration = time.monotonic() - started
        await asyncio.sleep(1)  # writes after the move, too
        await ledger.redis.set(stop, "1")
        outs = []
        for worker in workers:
            out, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err
            outs.append(json.loads(out.splitlines()[-1]))
    finally:
        await ledger.aclose()

    print(
        f"\n{SETTLED} settled holds written in {filled:.1f} s, archived in {emptied:.1f} s; "
        f"journal entries trimmed {trimmed}; keys in the slot {in_slot}; "
        f"slot moved ({moved} keys) in {migration * 1000:.0f} ms; writers {outs[:-1]}; "
        f"replays {outs[-1]}"
    )
    assert redis_cluster.primary_for(key) is target
    assert outs[-1] == {"fresh": 0}
    for out in outs[:-1]:
        assert out["failed"] == 0 and out["writes"] > 0, out
        assert out["longest_gap_ms"] <= 1000, out
    ledger = Ledger.from_url(redis_cluster.url)
    try:
        report = await audit_tenant(ledger, tenant)
        assert report.mismatches == []
        replayed = await replay_from_checkpoint(ledger, tenant)
        balances = {b.account: b for b in await ledger.balances(tenant)}
        assert balances["agent:old"].posted == 5 * SETTLED
        assert replayed is not None
        entries = [entry async for entry in iter_journal(ledger, tenant)]
        admissions = Counter(e.hold_id for e in entries if e.op == "reserve")
        assert not admissions or admissions.most_common(1)[0][1] == 1
        opened = Counter(e.fields["acct"] for e in entries if e.op == "account")
        assert all(count == 1 for count in opened.values())
    finally:
        await ledger.aclose()
