"""Redis Cluster as the ledger's store: telling a cluster node from a standalone
Redis, the cluster client, and a script followed by WAIT on the connection of the
primary that ran it.

redis-py's cluster client routes every keyed command by slot and follows MOVED and
ASK; what it cannot do for the ledger is WAIT: it sends WAIT to every primary on
pooled connections and sums the answers, which acknowledges writes those
connections never made (measured: "1 replica acknowledged" while that replica was
stopped). WAIT counts the replicas that have every write of *its connection*, so
here the script and the WAIT go out together on one connection to the slot's
primary.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeAlias

import redis
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import PipelineCommand, RedisCluster

RedisClient: TypeAlias = Redis | RedisCluster

DETECT_TIMEOUT_S = 2.0
# How long a call waits out a slot migration (TRYAGAIN: its keys are split between
# two nodes) before it gives up; a busy tenant's slot moves in well under this.
MIGRATION_WAIT_S = 30.0
_MIGRATION_PAUSE_S = 0.02


def cluster_enabled(url: str, **options: Any) -> bool:
    """Whether the Redis at `url` is a node of a Redis Cluster (INFO cluster). A
    server that cannot be asked (unreachable, wrong credentials, a user without
    INFO) counts as standalone: the ledger's first call says what is wrong, and on
    a cluster node that it was sent elsewhere (MOVED)."""
    if url.startswith("unix:"):
        return False
    kept = {k: v for k, v in options.items() if k in ("username", "password", "ssl")}
    try:
        with redis.Redis.from_url(
            url,
            socket_connect_timeout=DETECT_TIMEOUT_S,
            socket_timeout=DETECT_TIMEOUT_S,
            **kept,
        ) as probe:
            return bool(probe.info("cluster").get("cluster_enabled"))
    except redis_errors.RedisError:
        return False


def cluster_client(url: str, *, max_connections: int, **options: Any) -> RedisCluster:
    """redis-py's cluster client from one node's URL (it discovers the others).
    `max_connections` bounds each node's pool."""
    options.pop("retry", None)  # the cluster client retries by topology, not per node
    return RedisCluster.from_url(
        url, decode_responses=True, max_connections=max_connections, **options
    )


def redis_client(url: str, **options: Any) -> RedisClient:
    """An asyncio client for `url`: redis-py's cluster client when it names a node of
    a cluster, else a plain one (for tools and tests that read Redis directly)."""
    if cluster_enabled(url, **options):
        return RedisCluster.from_url(url, **options)
    return Redis.from_url(url, **options)


async def script_then_wait(
    cluster: RedisCluster,
    sha: str,
    keys: list[str],
    args: list[str],
    replicas: int,
    timeout_ms: int,
) -> tuple[Any, Any]:
    """EVALSHA then WAIT on one connection of the primary serving the keys' slot.
    Returns (script reply or error, WAIT reply or error). A MOVED refreshes the slot
    map and an ASK is followed with ASKING on that same connection; TRYAGAIN (a
    migration of the slot) is waited out. None of these ran the script, so sending
    it again is safe."""
    deadline = time.monotonic() + MIGRATION_WAIT_S
    asking_at: Any = None
    while True:
        if cluster._initialize:
            await cluster.initialize()
        node = asking_at or cluster.get_node_from_key(keys[0])
        if node is None:
            raise redis_errors.SlotNotCoveredError(f"no primary serves the slot of {keys[0]}")
        commands = [PipelineCommand(0, "ASKING")] if asking_at else []
        commands += [
            PipelineCommand(len(commands), "EVALSHA", sha, len(keys), *keys, *args),
            PipelineCommand(len(commands) + 1, "WAIT", replicas, timeout_ms),
        ]
        try:
            await node.execute_pipeline(commands)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError):
            # A primary gone (failover?): the next call reads the topology again,
            # as the cluster client's own calls do.
            cluster._initialize = True
            raise
        reply, acked = commands[-2].result, commands[-1].result
        asking_at = None
        if isinstance(reply, redis_errors.MovedError):
            await cluster.nodes_manager.move_slot(reply)
        elif isinstance(reply, redis_errors.AskError):
            asking_at = cluster.get_node(host=reply.host, port=reply.port)
            if asking_at is None:
                cluster._initialize = True
        elif isinstance(reply, redis_errors.TryAgainError):
            await asyncio.sleep(_MIGRATION_PAUSE_S)
        else:
            return reply, acked
        if time.monotonic() > deadline:
            return reply, acked


async def wait_out_migration(call: Any) -> Any:
    """Run `await call()` until it is not refused for a slot in migration (TRYAGAIN,
    or the cluster client's redirections running out meanwhile)."""
    deadline = time.monotonic() + MIGRATION_WAIT_S
    while True:
        try:
            return await call()
        except (redis_errors.TryAgainError, redis_errors.ClusterError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(_MIGRATION_PAUSE_S)
