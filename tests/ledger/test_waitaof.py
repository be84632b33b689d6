"""WAITAOF (Ledger's wait_aof) on a real Valkey primary and replica (Redis 7.2's
protocol; Debian's Redis 7.0 lacks the command): every write that waits reports
whether the primary fsynced it and how many replicas fsynced it; with fsyncs
turned off, or the replica SIGKILLed, the counts say so and nothing acknowledges
falsely."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from irrev.localcluster import LocalCluster
from ledger import EmbeddedRedis
from ledger.client import Ledger
from ledger.durability import Probe
from ledger.errors import LedgerUnavailable, RedisFailure
from ledger.keys import accounts_key
from ledger.records import AccountSpec, HoldState

from ..conftest import ReplicatedRedis, valkey_binary

# Slow (Valkey primaries and replicas, waits of seconds): .ci/run runs it, README's test
# command does not (a fresh machine has no valkey-server to run it on).
pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000


async def test_every_waiting_write_reports_the_fsyncs(
    replicated_valkey: ReplicatedRedis, tenant: str
) -> None:
    """ "local": WAITAOF 1 0 and WAIT 1; "all": WAITAOF 1 1 (a replica reports its
    fsyncs about once a second, hence the longer timeout)."""
    url = replicated_valkey.primary.url
    local = Ledger.from_url(url, replicas=1, replica_timeout_ms=2000, wait_aof="local")
    every = Ledger.from_url(url, replicas=1, replica_timeout_ms=3000, wait_aof="all")
    short = Ledger.from_url(url, replicas=1, replica_timeout_ms=300, wait_aof="all")
    try:
        await local.upsert_account(
            tenant,
            AccountSpec(
                account="tenant:acme", limit=10_000, soft_limit=10_000, approval_threshold=400
            ),
        )
        admitted = await local.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (admitted.state, admitted.fsynced, admitted.replicas) == (HoldState.PENDING, 1, 1)
        posted = await local.post(tenant, "k1", 150)  # an overrun: more than was held
        assert (posted.fsynced, posted.replicas) == (1, 1)
        escalated = await local.reserve(tenant, "k2", "fp", {"tenant:acme": 500}, ttl_ms=HOUR_MS)
        assert escalated.state is HoldState.ESCALATED
        approval = await local.approve(tenant, "k2", "admin", ttl_ms=HOUR_MS)
        assert (approval.fsynced, approval.replicas) == (1, 1)
        settled = await every.post(tenant, "k2", 400)
        assert (settled.fsynced, settled.replicas) == (1, 1)
        await every.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=9_000, soft_limit=9_000)
        )

        await asyncio.to_thread(replicated_valkey.replica.kill)
        alone = await short.reserve(tenant, "k3", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (alone.fsynced, alone.replicas) == (1, 0)  # kept locally, on no replica
        with pytest.raises(LedgerUnavailable) as lowered:  # a limit decrease
            await short.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=5_000, soft_limit=5_000)
            )
        assert lowered.value.cause is RedisFailure.NOT_REPLICATED
        assert "0 of 1 replicas fsynced the account change" in str(lowered.value)
    finally:
        for ledger in (local, every, short):
            await ledger.aclose()


async def test_a_write_the_primary_never_fsyncs_is_not_acknowledged(
    tenant: str, tmp_path: Path
) -> None:
    """appendfsync no: the server never fsyncs for WAITAOF, whose local count stays 0
    (a gateway refuses to start so; here it changed under a running ledger)."""
    with EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True) as server:
        await unfsynced(server.url, tenant)


async def unfsynced(url: str, tenant: str) -> None:
    ledger = Ledger.from_url(url, replica_timeout_ms=200, wait_aof="local")
    try:
        await ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        with redis.Redis.from_url(url) as admin:
            admin.config_set("appendfsync", "no")
        held = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (held.fsynced, held.replicas) == (0, None)  # no replicas asked for
        with pytest.raises(LedgerUnavailable) as lowered:
            await ledger.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=5_000, soft_limit=5_000)
            )
        assert lowered.value.cause is RedisFailure.NOT_FSYNCED
    finally:
        await ledger.aclose()


@pytest.mark.parametrize("denied", ["-waitaof", "-wait"])
async def test_a_write_whose_wait_is_refused_is_not_acknowledged(
    denied: str, tenant: str, tmp_path: Path
) -> None:
    """A Redis user that may run the scripts but not WAITAOF (or WAIT): the script ran,
    so the write is there, and the refused wait acknowledged nothing of what it counts
    (WAITAOF's fsync, WAIT's replicas), for the caller to release it; the other wait
    still counts. It raised LedgerUnavailable before (failed here), which tells a
    caller nothing was written while the hold stayed pending, armed and charged, to be
    forwarded on a repeat of its key."""
    with EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True) as server:
        with redis.Redis.from_url(server.url) as admin:
            admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all")
            admin.execute_command("ACL", "SETUSER", "app", denied)
        owner = Ledger.from_url(server.url)
        await owner.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
        )
        await owner.aclose()
        port = urlsplit(server.url).port
        ledger = Ledger.from_url(
            f"redis://app:pw@127.0.0.1:{port}", replicas=1, replica_timeout_ms=200, wait_aof="local"
        )
        try:
            held = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
            # No replica is attached: WAIT's count is 0 whether it runs or not.
            fsynced = 0 if denied == "-waitaof" else 1
            assert held.state is HoldState.PENDING
            assert (held.fsynced, held.replicas) == (fsynced, 0)
            posted = await ledger.post(tenant, "k1", 100)
            assert (posted.state, posted.fsynced, posted.replicas) == (
                HoldState.POSTED,
                fsynced,
                0,
            )
        finally:
            await ledger.aclose()


async def test_on_a_cluster_waitaof_counts_the_replica_of_the_primary_that_ran_the_script(
    tmp_path: Path, tenant: str
) -> None:
    """A Valkey Cluster (3 primaries, 3 replicas), AOF turned on: WAITAOF goes out on
    the connection of the tenant's primary, so with that primary's replica stopped
    and every other one up, no replica counts (a WAITAOF sent anywhere else would
    count one)."""
    cluster = LocalCluster(valkey_binary(), tmp_path / "cluster")
    try:
        await asyncio.to_thread(cluster.start)
        for node in cluster.nodes:
            with node.client() as client:
                client.config_set("appendonly", "yes")
        await asyncio.to_thread(_aof_written, cluster)
        ledger = Ledger.from_url(cluster.url, replicas=1, replica_timeout_ms=2500, wait_aof="all")
        try:
            await ledger.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
            )
            held = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
            assert (held.fsynced, held.replicas) == (1, 1)
            # The start probe writes in a slot of each primary: every one fsynced.
            assert await ledger.probe_waits() == Probe(fsynced=True)
            (replica,) = cluster.replicas_of(cluster.primary_for(accounts_key(tenant)))
            await asyncio.to_thread(replica.stop)
            alone = await ledger.reserve(tenant, "k2", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
            assert (alone.fsynced, alone.replicas) == (1, 0)
            # A replica that is down (not one that does not fsync) is a warning: the
            # writes fail closed until it is back.
            probe = await ledger.probe_waits()
            assert not probe.refusal and "0 of 1 replicas fsynced" in probe.warning, probe
        finally:
            await ledger.aclose()
    finally:
        cluster.stop()


def _aof_written(cluster: LocalCluster, deadline_s: float = 30.0) -> None:
    """Until every node has written its first AOF (turned on at run time, it is
    rewritten in the background, and WAITAOF waits for nothing before)."""
    deadline = time.monotonic() + deadline_s
    for node in cluster.nodes:
        with node.client() as client:
            while True:
                info = client.info("persistence")
                if info["aof_enabled"] and not info["aof_rewrite_in_progress"]:
                    break
                assert time.monotonic() < deadline, "the AOF was never written"
                time.sleep(0.05)
