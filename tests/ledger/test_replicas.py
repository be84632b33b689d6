"""WAIT on the reserve's own connection: a reserve or an approval says how many
replicas acknowledged it, against a real primary and replica (redis-server
processes) and against the session's local Redis Cluster, before and after the
replica is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import redis

from irrev.localcluster import LocalCluster
from ledger.client import Ledger
from ledger.errors import BadInput, LedgerError, LedgerUnavailable, RedisFailure
from ledger.keys import accounts_key
from ledger.records import (
    AccountSpec,
    HoldState,
    ReserveRequest,
    ReserveResult,
    Status,
    TransitionResult,
)

from ..conftest import ReplicatedRedis

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000
ROOT = Path(__file__).resolve().parents[2]


async def test_reserve_and_approve_report_acknowledging_replicas(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    await acknowledging_replicas(
        replicated_redis.primary.url, tenant, replicated_redis.replica.kill, replicated_redis.attach
    )


async def test_on_a_cluster_the_replica_of_the_primary_that_ran_the_script_is_counted(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    """The tenant's primary's replica stopped, every other primary's replica up: a
    WAIT anywhere but on the connection that ran the script would be acknowledged."""
    await with_tenant_replica(redis_cluster, tenant, acknowledging_replicas)


Check = Callable[[str, str, Callable[[], None], Callable[[], None]], Awaitable[None]]


async def with_tenant_replica(redis_cluster: LocalCluster, tenant: str, check: Check) -> None:
    """`check(url, tenant, stop_replica, restore_replica)` on the cluster, where the
    replica it stops is the one of the primary of the tenant's slot."""
    (replica,) = redis_cluster.replicas_of(redis_cluster.primary_for(accounts_key(tenant)))

    def restore() -> None:
        replica.start()
        redis_cluster.wait_healthy()

    try:
        await check(redis_cluster.url, tenant, replica.stop, restore)
    finally:
        if not replica.answers():
            await asyncio.to_thread(restore)


async def acknowledging_replicas(
    url: str, tenant: str, stop_replica: Callable[[], None], restore_replica: Callable[[], None]
) -> None:
    ledger = Ledger.from_url(url, replicas=1, replica_timeout_ms=2000)
    plain = Ledger.from_url(url)
    try:
        await ledger.upsert_account(
            tenant,
            AccountSpec(
                account="tenant:acme", limit=10_000, soft_limit=10_000, approval_threshold=400
            ),
        )
        admitted = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (admitted.state, admitted.replicas) == (HoldState.PENDING, 1)
        for key in ("k2", "k2-later"):
            escalated = await ledger.reserve(
                tenant, key, "fp", {"tenant:acme": 450}, ttl_ms=HOUR_MS
            )
            assert escalated.state is HoldState.ESCALATED
        assert (await ledger.approve(tenant, "k2", "ops", ttl_ms=HOUR_MS)).replicas == 1
        assert (
            await plain.reserve(tenant, "k3", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
        ).replicas is None

        await asyncio.to_thread(stop_replica)
        lonely = await ledger.reserve(tenant, "k4", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        # The primary still decides and writes; only the caller can refuse to act on it.
        assert (lonely.state, lonely.replicas) == (HoldState.PENDING, 0)
        replay = await ledger.reserve(tenant, "k4", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert replay.replayed and replay.replicas == 0
        approved = await ledger.approve(tenant, "k2-later", "ops", ttl_ms=HOUR_MS)
        assert (approved.state, approved.replicas) == (HoldState.PENDING, 0)
        # An overrun post and a limit decrease wait for the replicas too: lost in a
        # failover, either would let the account be spent again.
        overrun = await ledger.post(tenant, "k1", 300)
        assert "overrun" in overrun.flags and overrun.replicas == 0
        with pytest.raises(LedgerUnavailable) as refused:
            await ledger.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=5_000, soft_limit=5_000)
            )
        assert refused.value.cause is RedisFailure.NOT_REPLICATED

        await asyncio.to_thread(restore_replica)
        back = await ledger.reserve(tenant, "k5", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert back.replicas == 1
        assert (await ledger.post(tenant, "k5", 100)).replicas == 1
        await ledger.redis.script_flush()  # what a restarted Redis has forgotten
        again = await ledger.reserve(tenant, "k6", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (again.state, again.replicas) == (HoldState.PENDING, 1)
    finally:
        await ledger.aclose()
        await plain.aclose()


async def test_batches_report_what_their_waits_acknowledged(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    """reserve_many and post_many end their pipeline with the ledger's waits, as reserve
    and post do: with the replica SIGKILLed every item says 0 replicas (not None, "not
    asked for", as if nothing were configured) and every post is reported short."""
    await batch_acknowledgements(
        replicated_redis.primary.url, tenant, replicated_redis.replica.kill, replicated_redis.attach
    )


async def test_on_a_cluster_a_batch_is_waited_for_on_its_primary(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    await with_tenant_replica(redis_cluster, tenant, batch_acknowledgements)


@pytest.mark.parametrize("replicas", [0, 1])
async def test_a_batch_item_whose_resend_fails_gets_its_error_in_place(
    redis_cluster: LocalCluster, tenant: str, replicas: int
) -> None:
    """A batch sent on a stale slot map is answered MOVED, and its re-send to the
    slot's primary times out (that primary stalled: SIGSTOP, for less than the node
    timeout). Each item gets its error in place, waits or not: with waits a
    ValueError escaped the whole batch (the failed re-send had no wait answers)."""
    primary = redis_cluster.primary_for(accounts_key(tenant))
    assert primary.process is not None
    plain = Ledger.from_url(redis_cluster.url)
    try:
        await plain.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
    finally:
        await plain.aclose()
    url, pid = redis_cluster.url, str(primary.process.pid)
    command = ["--replicas", str(replicas), "stale_batch", url, tenant, url, pid]
    worker = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.ledger.workers", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    await asyncio.to_thread(redis_cluster.wait_healthy)
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout.splitlines()[-1]) == ["LedgerUnavailable"] * 2


async def batch_acknowledgements(
    url: str, tenant: str, stop_replica: Callable[[], None], restore_replica: Callable[[], None]
) -> None:
    short: list[str] = []
    ledger = Ledger.from_url(url, replicas=1, replica_timeout_ms=1000)
    ledger.on_unacknowledged = short.append

    def orders(*keys: str) -> list[ReserveRequest]:
        return [
            ReserveRequest(
                idempotency_key=key, fingerprint="fp", amounts={"tenant:acme": 100}, ttl_ms=HOUR_MS
            )
            for key in keys
        ]

    try:
        await ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        assert replicas_of(await ledger.reserve_many(tenant, orders("a1", "a2", "a3"))) == [1] * 3
        assert replicas_of(await ledger.post_many(tenant, [("a1", 100)])) == [1]

        await asyncio.to_thread(stop_replica)
        assert replicas_of(await ledger.reserve_many(tenant, orders("b1", "b2"))) == [0, 0]
        assert replicas_of(await ledger.post_many(tenant, [("a2", 100), ("b1", 150)])) == [0, 0]
        assert short == ["post", "post"]

        await asyncio.to_thread(restore_replica)
        assert replicas_of(await ledger.reserve_many(tenant, orders("c1"))) == [1]
        assert replicas_of(await ledger.post_many(tenant, [("a3", 100), ("c1", 100)])) == [1, 1]
        assert short == ["post", "post"]
    finally:
        await ledger.aclose()


def replicas_of(
    results: Sequence[ReserveResult | TransitionResult | LedgerError],
) -> list[int | None]:
    counts = []
    for result in results:
        assert not isinstance(result, LedgerError), result
        counts.append(result.replicas)
    return counts


@pytest.mark.parametrize(("replicas", "timeout_ms"), [(-1, 100), (65, 100), (1, 0), (1, 60_001)])
def test_replica_settings_are_checked(replicas: int, timeout_ms: int) -> None:
    with pytest.raises(BadInput):
        Ledger.from_url("redis://127.0.0.1:1/0", replicas=replicas, replica_timeout_ms=timeout_ms)


async def test_a_repeated_settlement_is_waited_for_on_its_own_connection(
    replicated_valkey: ReplicatedRedis, tenant: str
) -> None:
    """A post (and a true-up) acknowledged short is repeated by its settler until its
    wait is met, maybe through another ledger (another gateway worker). Since Redis 7.2
    (Valkey) WAIT counts the writes of its own connection only: a repeat whose script
    wrote nothing would be acknowledged at once by a replica that never got the
    settlement (one SIGSTOPped is still connected, at the offset of that connection's
    earlier writes). The replay re-sets a field of the hold, so the repeat's wait
    covers the settlement. (Redis 6.2 and 7.0 wait for every write made so far.)"""
    await repeated_settlement(replicated_valkey, tenant)


async def test_a_replayed_reserve_is_waited_for_on_its_own_connection(
    replicated_valkey: ReplicatedRedis, tenant: str
) -> None:
    """A replay of a reserve on another connection (another gateway worker) that has
    written before: since Redis 7.2 (Valkey) its WAIT counts only that connection's
    writes, and a replay that wrote nothing was acknowledged by a replica that never
    got the hold (SIGSTOPped before it was reserved). The replay re-sets the hold's
    fingerprint, so its wait covers the reserve; it failed before (replicas 1)."""
    url, replica_pid = replicated_valkey.primary.url, replicated_valkey.replica.pid
    ledger = Ledger.from_url(url, replicas=1, replica_timeout_ms=300)
    other = Ledger.from_url(url, replicas=1, replica_timeout_ms=300)
    try:
        await ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        await other.reserve(tenant, "w0", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            first = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
            assert first.replicas == 0
            again = await other.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
            assert (again.status, again.replicas) == (Status.EXISTS, 0)
            (batched,) = await other.reserve_many(
                tenant,
                [
                    ReserveRequest(
                        idempotency_key="k1",
                        fingerprint="fp",
                        amounts={"tenant:acme": 100},
                        ttl_ms=HOUR_MS,
                    )
                ],
            )
            assert replicas_of([batched]) == [0]
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        patient = Ledger.from_url(url, replicas=1, replica_timeout_ms=5000)
        try:
            replayed = await patient.reserve(
                tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS
            )
        finally:
            await patient.aclose()
        assert (replayed.status, replayed.replicas) == (Status.EXISTS, 1)
    finally:
        await ledger.aclose()
        await other.aclose()


async def test_on_redis_before_7_2_a_repeated_settlement_is_waited_for_too(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    await repeated_settlement(replicated_redis, tenant)


async def repeated_settlement(replicated_redis: ReplicatedRedis, tenant: str) -> None:
    url, replica_pid = replicated_redis.primary.url, replicated_redis.replica.pid
    ledger = Ledger.from_url(url, replicas=1, replica_timeout_ms=300)
    other = Ledger.from_url(url, replicas=1, replica_timeout_ms=300)
    try:
        await ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        for key in ("k1", "k2", "k3"):
            await ledger.reserve(tenant, key, "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        await ledger.post(tenant, "k2", 100)
        assert (await other.post(tenant, "k3", 100)).replicas == 1  # its connection's write
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            posted = await ledger.post(tenant, "k1", 300)
            assert (posted.status, posted.replicas) == (Status.OK, 0)
            raised = await ledger.true_up(tenant, "k2", 400)
            assert (raised.status, raised.replicas) == (Status.OK, 0)
            again = await other.post(tenant, "k1", 300)
            assert (again.status, again.state, again.replicas) == (
                Status.EXISTS,
                HoldState.POSTED,
                0,
            )
            same = await other.true_up(tenant, "k2", 400)
            assert (same.status, same.replicas) == (Status.EXISTS, 0)
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        other.replica_timeout_ms = 5000
        other.waits = [("WAIT", 1, 5000)]
        assert (await other.post(tenant, "k1", 300)).replicas == 1
        assert (await other.true_up(tenant, "k2", 400)).replicas == 1
        assert (await ledger.post(tenant, "k1", 300)).replicas == 1
    finally:
        await ledger.aclose()
        await other.aclose()


async def test_a_settlement_lost_in_a_failover_is_made_again_by_its_repeat(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    """The post acknowledged short never reached the replica; the primary is lost and
    the replica serves on its own: the repeat finds the hold pending and posts it."""
    primary, replica = replicated_redis.primary, replicated_redis.replica
    ledger = Ledger.from_url(primary.url, replicas=1, replica_timeout_ms=300)
    try:
        await ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        reserved = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert reserved.replicas == 1
        await asyncio.to_thread(persisted, replica.url)
        await asyncio.to_thread(replica.kill)
        assert (await ledger.post(tenant, "k1", 300)).replicas == 0
    finally:
        await ledger.aclose()
    await asyncio.to_thread(primary.kill)
    await asyncio.to_thread(replica.ensure_running)  # a primary of its own now
    promoted = Ledger.from_url(replica.url)
    try:
        assert (hold := await promoted.hold(tenant, "k1")) is not None
        assert hold.state is HoldState.PENDING
        again = await promoted.post(tenant, "k1", 300)
        assert (again.status, again.state, again.flags) == (
            Status.OK,
            HoldState.POSTED,
            frozenset({"overrun"}),
        )
    finally:
        await promoted.aclose()


def persisted(url: str, deadline_s: float = 30.0) -> None:
    """Wait until the replica's AOF holds what it has (its first sync rewrites it)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        deadline = time.monotonic() + deadline_s
        while True:
            info = client.info("persistence")
            if not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]):
                return
            assert time.monotonic() < deadline, "the replica never rewrote its AOF"
            time.sleep(0.05)
    finally:
        client.close()
