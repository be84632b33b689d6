"""Redis Cluster as the ledger's store, against the session's local 3-primary +
3-replica cluster (tests/cluster.py): any node's URL is recognised, a standalone
client is refused with the cause, and WAIT counts the replicas of the primary that
ran the script, on its connection, so a stopped replica is never acknowledged."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ledger.client import Ledger
from ledger.errors import LedgerUnavailable
from ledger.keys import accounts_key
from ledger.records import AccountSpec, HoldState

from ..cluster import LocalCluster
from .conftest import open_accounts

HOUR_MS = 3_600_000


async def test_any_node_url_opens_a_cluster_ledger(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    for node in redis_cluster.nodes:  # primaries and replicas alike
        ledger = Ledger.from_url(node.url)
        try:
            assert isinstance(ledger.redis, RedisCluster)
            await ledger.ping()
            await open_accounts(ledger, tenant, tenant_acme=1000)
            result = await ledger.reserve(tenant, "k", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS)
            assert result.state is HoldState.PENDING
        finally:
            await ledger.aclose()


async def test_a_standalone_client_on_a_cluster_is_refused_with_the_cause(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    # A node that does not serve the tenant's slot: every call there is MOVED.
    serving = redis_cluster.primary_for(accounts_key(tenant))
    elsewhere = next(n for n in redis_cluster.nodes[:3] if n is not serving)
    standalone = Ledger(Redis.from_url(elsewhere.url, decode_responses=True))
    try:
        with pytest.raises(LedgerUnavailable, match="node of a Redis Cluster") as refused:
            await standalone.ping()
        assert "unreachable" not in str(refused.value)
        with pytest.raises(LedgerUnavailable, match="Redis Cluster") as moved:
            await standalone.upsert_account(tenant, AccountSpec("tenant:acme", 10, 10))
        assert "unreachable" not in str(moved.value) and "MOVED" in str(moved.value)
        with pytest.raises(LedgerUnavailable, match="Redis Cluster"):
            await standalone.balances(tenant)
    finally:
        await standalone.aclose()


async def test_wait_counts_the_replica_of_the_primary_that_ran_the_script(
    redis_cluster: LocalCluster, tenant: str
) -> None:
    ledger = Ledger.from_url(redis_cluster.url, replicas=1, replica_timeout_ms=500)
    primary = redis_cluster.primary_for(accounts_key(tenant))
    (replica,) = redis_cluster.replicas_of(primary)
    try:
        await ledger.upsert_account(
            tenant, AccountSpec("tenant:acme", 10_000, 10_000, approval_threshold=400)
        )
        admitted = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (admitted.state, admitted.replicas) == (HoldState.PENDING, 1)
        escalated = await ledger.reserve(tenant, "k2", "fp", {"tenant:acme": 450}, ttl_ms=HOUR_MS)
        assert escalated.state is HoldState.ESCALATED

        await asyncio.to_thread(replica.stop)
        # Other primaries' replicas are all up: a WAIT anywhere but on the
        # script's own connection would find one of them.
        lonely = await ledger.reserve(tenant, "k3", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (lonely.state, lonely.replicas) == (HoldState.PENDING, 0)
        approved = await ledger.approve(tenant, "k2", "ops", ttl_ms=HOUR_MS)
        assert (approved.state, approved.replicas) == (HoldState.PENDING, 0)
        replay = await ledger.reserve(tenant, "k3", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert replay.replayed and replay.replicas == 0
    finally:
        await asyncio.to_thread(replica.start)
        await asyncio.to_thread(redis_cluster.wait_healthy)
    try:
        back = await ledger.reserve(tenant, "k4", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert back.replicas == 1
        await ledger.redis.script_flush()  # what a restarted or failed-over Redis forgot
        again = await ledger.reserve(tenant, "k5", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (again.state, again.replicas) == (HoldState.PENDING, 1)
    finally:
        await ledger.aclose()
