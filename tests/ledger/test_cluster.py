"""Redis Cluster as the ledger's store, against the session's local 3-primary +
3-replica cluster (irrev/localcluster.py): any node's URL is recognised, a standalone
client is refused with the cause, and a busy tenant's slot can move to another node.
(WAIT on a cluster: test_replicas.py.)"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode as RedisClusterNode
from redis.asyncio.cluster import RedisCluster

from gateway.edge.problems import problem_for
from irrev.bench.background import calls, primaries
from irrev.localcluster import ClusterNode, LocalCluster
from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import LedgerUnavailable, RedisFailure
from ledger.journal import iter_journal
from ledger.keys import accounts_key
from ledger.records import AccountSpec, HoldState

from .conftest import open_accounts
from .test_concurrency import release, spawn

HOUR_MS = 3_600_000
WORKERS = 8


def node_of(client: RedisCluster, key: str) -> RedisClusterNode:
    """The primary serving `key`'s slot, as the client's slot map has it."""
    node = client.get_node_from_key(key)
    assert node is not None, f"no node serves {key}"
    return node


async def test_any_node_url_opens_a_cluster_ledger(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    for node in redis_cluster.nodes:  # primaries and replicas alike
        ledger = Ledger.from_url(node.url)
        try:
            assert isinstance(ledger.redis, RedisCluster)
            await ledger.load_scripts()
            await open_accounts(ledger, tenant, tenant_acme=1000)
            result = await ledger.reserve(tenant, "k", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS)
            assert result.state is HoldState.PENDING
        finally:
            await ledger.aclose()


async def test_the_background_bench_counts_the_commands_of_every_primary(
    redis_cluster: LocalCluster,
) -> None:
    """`irrev bench background` on a cluster: a tenant's work lands on its slot's node,
    so commands are summed over the primaries (it read the first node only). The
    writes go between its two readings of the primaries' counts (commands_during
    sleeps between them: writes timed to land in its window began, on a loaded CI
    machine, before its first reading, and 27 of 30 were counted)."""
    client = RedisCluster.from_url(redis_cluster.url)
    keys = [f"bench-count:{{{i}}}" for i in range(30)]
    primary_clients = await primaries(redis_cluster.url)
    try:
        await client.initialize()
        nodes = {node_of(client, key).name for key in keys}
        before = await calls(primary_clients)
        for key in keys:
            await client.set(key, "1")
        counted = await calls(primary_clients) - before
    finally:
        await client.aclose()
        for primary in primary_clients:
            await primary.aclose()
    assert len(nodes) > 1, nodes  # the keys' slots are on several primaries
    assert counted["set"] >= len(keys), counted


async def test_a_standalone_client_on_a_cluster_is_refused_with_the_cause(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    # A primary that does not serve the tenant's slot: every call there is MOVED. By
    # role, not position: an earlier test's failover may have made a replica of one
    # of the first nodes (a write there is then refused as read-only, not MOVED).
    serving = redis_cluster.primary_for(accounts_key(tenant))
    elsewhere = next(n for n in redis_cluster.nodes if n is not serving and _role(n) == "master")
    standalone = Ledger(Redis.from_url(elsewhere.url, decode_responses=True))
    try:
        with pytest.raises(LedgerUnavailable, match="node of a Redis Cluster") as refused:
            await standalone.load_scripts()  # what a gateway does first
        assert "unreachable" not in str(refused.value)
        with pytest.raises(LedgerUnavailable, match="Redis Cluster") as moved:
            await standalone.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=10, soft_limit=10)
            )
        assert "unreachable" not in str(moved.value) and "MOVED" in str(moved.value)
        with pytest.raises(LedgerUnavailable, match="Redis Cluster"):
            await standalone.balances(tenant)
    finally:
        await standalone.aclose()


async def test_resharding_a_busy_tenant_keeps_the_ledger_whole(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    """Contract 1, 3 and 7 across a slot migration: the tenant's slot moves to another
    primary, key by key, while separate processes reserve, settle and replay holds
    admitted before. Scripts whose keys are split between the nodes are answered
    TRYAGAIN and sent again, so none runs on half a tenant: no replay is admitted
    afresh, no account is opened again, and the journal still adds up."""
    ledger = Ledger.from_url(redis_cluster.url)
    try:
        await open_accounts(ledger, tenant, tenant_acme=10**9)
        for agent in ("c0", "c1", "c2", "old", "b0"):
            await open_accounts(ledger, tenant, **{f"agent_{agent}": 10**8})
        for i in range(100):
            amounts = {"tenant:acme": 5, "agent:old": 5}
            await ledger.reserve(tenant, f"old-{i}", "fp", amounts, ttl_ms=HOUR_MS)
        name = f"{tenant}:barrier"
        # One churner waits for a replica after each reserve: its script and WAIT
        # follow the slot to the new primary together.
        waits = [[], [], ["--replicas", "1"]]
        churners = [
            spawn(*waits[p], "churn", redis_cluster.url, tenant, name, f"c{p}", "400")
            for p in range(3)
        ]
        batcher = spawn("batches", redis_cluster.url, tenant, name, "b0", "1000")
        replayer = spawn("replay", redis_cluster.url, tenant, name, "old", "100", "20")
        workers = [*churners, batcher, replayer]
        await release(ledger, name, len(workers))
        for churner in churners:  # under way: 50 operations each before the move
            assert churner.stdout is not None
            for _ in range(50):
                assert churner.stdout.readline()

        key = accounts_key(tenant)
        source = redis_cluster.primary_for(key)
        target = next(
            n
            for n in redis_cluster.nodes
            if n is not source and n.port in _primaries(redis_cluster)
        )
        before = _redirections(source, target)
        moved = await asyncio.to_thread(
            redis_cluster.migrate_slot, key, target, per_batch=5, pause_s=0.01
        )
        met = _redirections(source, target) - before
        outs = []
        for worker in workers:
            out, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err
            outs.append(json.loads(out.splitlines()[-1]))
        assert outs == [*[{"unreplicated": 0}] * 3, {"failed": 0}, {"fresh": 0}]
    finally:
        await ledger.aclose()

    assert moved > 100 and redis_cluster.primary_for(key) is target
    assert met["TRYAGAIN"] > 0, f"no script met the slot mid-migration: {met}"
    print(f"\nslot migration: {moved} keys moved; answers met meanwhile: {dict(met)}")
    ledger = Ledger.from_url(redis_cluster.url)
    try:
        report = await audit_tenant(ledger, tenant)
        assert report.mismatches == []
        assert report.entries > 5 + 100 + 3 * 400 + 2 * 1000
        for balance in await ledger.balances(tenant):
            assert balance.used <= balance.limit
        entries = [entry async for entry in iter_journal(ledger, tenant)]
        admissions = Counter(
            e.hold_id for e in entries if e.op == "reserve" and e.state != "denied"
        )
        assert admissions.most_common(1)[0][1] == 1
        opened = Counter(e.fields["acct"] for e in entries if e.op == "account")
        assert set(opened.values()) == {1}
    finally:
        await ledger.aclose()


def _primaries(cluster: LocalCluster) -> set[int]:
    ports = set()
    for node in cluster.nodes:
        with node.client() as client:
            if client.info("replication")["role"] == "master":
                ports.add(node.port)
    return ports


def _redirections(*nodes: ClusterNode) -> Counter[str]:
    """TRYAGAIN, ASK and MOVED answers the nodes gave so far (INFO errorstats)."""
    seen: Counter[str] = Counter()
    for node in nodes:
        with node.client() as client:
            for name, stats in client.info("errorstats").items():
                seen[name.removeprefix("errorstat_")] += int(stats["count"])
    return seen


async def test_a_primary_killed_under_load_loses_no_acknowledged_debit(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    """With WAIT for one replica, WORKERS clients reserve and post against one tenant
    while its primary is SIGKILLed: every reserve and post its replica acknowledged
    survives (the replica is promoted with it), and the audit is clean. The time each
    client could not write is measured and printed (not asserted)."""
    ledger = Ledger.from_url(redis_cluster.url, replicas=1, replica_timeout_ms=300)
    primary = redis_cluster.primary_for(accounts_key(tenant))
    reserved: list[str] = []
    posted: list[str] = []
    killed = asyncio.Event()
    killed_at = 0.0
    outage: dict[int, float] = {}

    async def client(worker: int) -> None:
        for i in range(100_000):
            hold_id = f"w{worker}-{i}"
            try:
                held = await ledger.reserve(
                    tenant, hold_id, "fp", {"tenant:acme": 2}, ttl_ms=HOUR_MS
                )
                if (held.replicas or 0) >= 1:
                    reserved.append(hold_id)
                settled = await ledger.post(tenant, hold_id, 1)
                if (settled.replicas or 0) >= 1:
                    posted.append(hold_id)
            except LedgerUnavailable:
                await asyncio.sleep(0.05)
                continue
            if killed.is_set() and worker not in outage:
                outage[worker] = time.monotonic() - killed_at
                return  # (the new primary has no replica yet: each WAIT times out)

    try:
        await open_accounts(ledger, tenant, tenant_acme=10**12)
        clients = [asyncio.create_task(client(w)) for w in range(WORKERS)]
        async with asyncio.timeout(120):
            while len(posted) < 200:
                await asyncio.sleep(0.01)
        await asyncio.to_thread(primary.stop)
        killed_at = time.monotonic()
        killed.set()
        await asyncio.wait_for(asyncio.gather(*clients), timeout=120)
        print(
            f"\nfailover under {WORKERS} clients: writes failed for "
            f"{min(outage.values()):.2f}-{max(outage.values()):.2f} s after SIGKILL"
        )
        assert len(reserved) >= 200 and len(posted) >= 200
        for hold_id in reserved:
            assert await ledger.hold(tenant, hold_id) is not None, hold_id
        for hold_id in posted:
            hold = await ledger.hold(tenant, hold_id)
            assert hold is not None and hold.state is HoldState.POSTED, hold_id
        assert (await audit_tenant(ledger, tenant)).mismatches == []
    finally:
        await ledger.aclose()
        await asyncio.to_thread(primary.start)  # it comes back as the new primary's replica
        await asyncio.to_thread(redis_cluster.wait_healthy)


def _role(node: ClusterNode) -> str:
    with node.client() as client:
        role = client.execute_command("ROLE")[0]
    return role.decode() if isinstance(role, bytes) else str(role)


async def test_a_call_past_the_migration_wait_fails_closed_with_its_own_reason(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    """A slot migration that never ends (a reshard tool that died between SETSLOT
    MIGRATING and SETSLOT NODE): a reserve waits IRREV_MIGRATION_WAIT_S, then fails
    with the cause MIGRATING (the gateway's 503 ledger_migrating) and nothing written;
    once the slot is stable again the same call is admitted, once."""
    ledger = Ledger.from_url(redis_cluster.url, migration_wait_s=1.0)
    key = accounts_key(tenant)
    amounts = {"tenant:acme": 5}
    try:
        await open_accounts(ledger, tenant, tenant_acme=1000)
        with redis_cluster.stuck_migration(key), pytest.raises(LedgerUnavailable) as refused:
            await ledger.reserve(tenant, "stuck", "fp", amounts, ttl_ms=HOUR_MS)
        assert refused.value.cause is RedisFailure.MIGRATING
        assert "IRREV_MIGRATION_WAIT_S" in str(refused.value)
        assert problem_for(refused.value).reason == "ledger_migrating"
        assert await ledger.hold(tenant, "stuck") is None
        assert (await ledger.live_counts(tenant))["pending"] == 0
        result = await ledger.reserve(tenant, "stuck", "fp", amounts, ttl_ms=HOUR_MS)
        assert result.status.value == "ok" and result.state is HoldState.PENDING
    finally:
        await ledger.aclose()
