"""`irrev serve` with IRREV_WAIT_REPLICAS=1 says at start (one `ledger topology`
warning, with what to change) when one failure would leave a primary without a
replica to acknowledge: on a replicated standalone Redis (INFO replication) and on
a Redis Cluster (CLUSTER NODES); and does not where each primary has two. Real
servers, real `irrev serve` processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from irrev.localcluster import LocalCluster
from ledger import EmbeddedRedis
from tests.ledger.test_embedded import wait_until

from ..conftest import ReplicatedRedis
from .servers import BIN, Server, base_env, write_policy

# Slow (gateways started and stopped): .ci/run runs it, README's test command does not.
pytestmark = pytest.mark.slow


def topology_lines(redis_url: str, root: Path) -> list[dict[str, Any]]:
    """The `ledger topology` lines of a one-worker gateway with IRREV_WAIT_REPLICAS=1
    on `redis_url`, started until ready and stopped."""
    policies = root / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    write_policy(policies, "procurement", "topology", "http://127.0.0.1:9")
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policies),
        IRREV_WAIT_REPLICAS="1",
        IRREV_WAIT_TIMEOUT_MS="1000",
    )
    log = root / "gateway.log"
    log.unlink(missing_ok=True)
    gateway = Server(name="gateway", argv=[str(BIN / "irrev"), "serve"], env=env, log_path=log)
    gateway.argv += ["--port", str(gateway.port), "--workers", "1"]
    gateway.start("/readyz")
    gateway.stop()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line["msg"] == "ledger topology"]


def test_a_standalone_primary_with_one_replica_is_short_with_two_it_is_not(
    replicated_redis: ReplicatedRedis, tmp_path: Path
) -> None:
    primary = replicated_redis.primary.url
    (short,) = topology_lines(primary, tmp_path)
    assert short["level"] == "warning"
    address = f"127.0.0.1:{urlsplit(primary).port}"
    assert short["replicas"] == {address: 1}
    assert f"{address} has 1:" in short["shortfall"]
    assert "give each primary 2 replicas, or lower IRREV_WAIT_REPLICAS" in short["shortfall"]

    with EmbeddedRedis(
        tmp_path / "second", binary=replicated_redis.replica.binary, tcp=True
    ) as second:
        attach(second, primary, replicas=2)
        (enough,) = topology_lines(primary, tmp_path)
    assert enough["level"] == "info" and enough["replicas"] == {address: 2}
    assert "shortfall" not in enough


def test_a_cluster_of_one_replica_per_primary_is_short(
    redis_cluster: LocalCluster, tmp_path: Path
) -> None:
    (short,) = topology_lines(redis_cluster.url, tmp_path)
    assert short["level"] == "warning"
    assert sorted(short["replicas"].values()) == [1, 1, 1]
    assert short["shortfall"].count(" has 1") == 3


def test_a_cluster_of_two_replicas_per_primary_is_not(
    redis_cluster_2_replicas: LocalCluster, tmp_path: Path
) -> None:
    (enough,) = topology_lines(redis_cluster_2_replicas.url, tmp_path)
    assert enough["level"] == "info"
    assert sorted(enough["replicas"].values()) == [2, 2, 2]


def attach(replica: EmbeddedRedis, primary_url: str, replicas: int) -> None:
    """`replica` following the primary at `primary_url`, until the primary counts
    `replicas`."""
    port = urlsplit(primary_url).port
    with (
        redis.Redis.from_url(replica.url) as follower,
        redis.Redis.from_url(primary_url, decode_responses=True) as leader,
    ):
        follower.execute_command("REPLICAOF", "127.0.0.1", str(port))
        wait_until(
            lambda: leader.info("replication")["connected_slaves"] >= replicas,
            "the replica to attach",
        )
