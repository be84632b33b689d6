"""Redis Cluster as the ledger's store: telling a cluster node from a standalone
Redis, the cluster client, and commands sent straight to the primary of a key's
slot (a script, or a script followed by WAIT on the connection that ran it).

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
# What a cluster node answers when a call is not for it now; none of them ran it.
REDIRECTED = (redis_errors.MovedError, redis_errors.AskError, redis_errors.TryAgainError)


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


async def on_primary(
    cluster: RedisCluster,
    key: str,
    commands: list[tuple[Any, ...]],
    *,
    watch: int | None = 0,
    wait_s: float = MIGRATION_WAIT_S,
) -> list[Any]:
    """`commands` in one pipeline on one connection of the primary serving `key`'s
    slot; their replies or errors, in order. While command `watch` is answered that
    it did not run there (MOVED: the slot map is refreshed; ASK: the commands go to
    the importing node after ASKING, on that connection; TRYAGAIN: a migration
    splits the keys, waited out for `wait_s`) all are sent again; `watch` None sends
    once (a batch whose items may have run in part). A connection error marks the
    topology for a reload (a primary gone: failover) and is raised."""
    deadline = time.monotonic() + wait_s
    asking_at: Any = None
    while True:
        if cluster._initialize:
            await cluster.initialize()
        node = asking_at or cluster.get_node_from_key(key)
        if node is None:
            raise redis_errors.SlotNotCoveredError(f"no primary serves the slot of {key}")
        sent = [PipelineCommand(0, "ASKING")] if asking_at else []
        sent += [PipelineCommand(len(sent) + i, *command) for i, command in enumerate(commands)]
        try:
            await node.execute_pipeline(sent)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError):
            cluster._initialize = True
            raise
        replies = [command.result for command in sent[len(sent) - len(commands) :]]
        asking_at = None
        moved = next((r for r in replies if isinstance(r, redis_errors.MovedError)), None)
        if moved is not None:
            await cluster.nodes_manager.move_slot(moved)
        if watch is None or not isinstance(replies[watch], REDIRECTED):
            return replies
        if time.monotonic() > deadline:
            return replies
        redirect = replies[watch]
        if isinstance(redirect, redis_errors.AskError):
            asking_at = cluster.get_node(host=redirect.host, port=redirect.port)
            if asking_at is None:
                cluster._initialize = True
        elif isinstance(redirect, redis_errors.TryAgainError):
            await asyncio.sleep(_MIGRATION_PAUSE_S)


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
