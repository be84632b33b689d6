"""The ledger's Redis topology: a standalone server or a Redis Cluster, chosen once
per client (`topology_of`), as one object whose methods are what the ledger's call
sites do differently on each (send a command to the server holding a key, pipeline
commands there, wait out a slot migration, read each primary); and the rule over
the replicas each primary has that says whether IRREV_WAIT_REPLICAS survives one
failure (`failover_shortfall`: pure)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from itertools import count
from typing import Any, Protocol, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .cluster import MIGRATION_WAIT_S, RedisClient, on_primary, wait_out_migration

T = TypeVar("T")


class Topology(Protocol):
    """What the ledger does differently on a standalone Redis and on a cluster."""

    @property
    def redis(self) -> RedisClient: ...

    @property
    def clustered(self) -> bool: ...

    async def send(self, command: tuple[Any, ...], key: str, *, wait_s: float) -> Any:
        """One command on the server holding `key`; its error raised."""

    async def pipeline(
        self,
        key: str,
        commands: list[tuple[Any, ...]],
        *,
        watch: int | None = 0,
        wait_s: float = MIGRATION_WAIT_S,
    ) -> list[Any]:
        """`commands` in one pipeline on one connection of the server holding `key`:
        their replies, errors in place (cluster.on_primary says what `watch` and
        `wait_s` do on a cluster)."""

    async def through_migration(self, call: Callable[[], Awaitable[T]]) -> T:
        """`await call()`, sent again while a slot migration refuses it."""

    async def each_primary(self, read: Callable[..., Awaitable[T]]) -> list[T]:
        """`read` of each primary (on a cluster, with its `target_nodes`)."""

    async def key_per_primary(self, pattern: str) -> list[str]:
        """A key `pattern % n` held by each primary (the hash tag picks the slot)."""

    async def replicas(self) -> dict[str, int]:
        """How many replicas each primary has now, by its address."""

    async def primaries(self) -> list[str]:
        """The name of each primary ("" for a standalone server)."""

    def primary_of(self, key: str) -> str:
        """The name of the primary holding `key` now ("" for a standalone server)."""

    def where(self, key: str) -> str:
        """How a message names the server holding `key` ("" where there is one)."""

    async def mismatched(self) -> bool:
        """Whether the server is of another topology than the client: a node of a
        Redis Cluster behind a standalone client, which most calls would find sent
        elsewhere (MOVED)."""


def topology_of(redis: RedisClient) -> Topology:
    """The topology of `redis`'s client: the one place that tells them apart."""
    if isinstance(redis, RedisCluster):
        return Cluster(redis)
    return Standalone(redis)


class Standalone:
    """One Redis server, which holds every key."""

    clustered = False

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def send(self, command: tuple[Any, ...], key: str, *, wait_s: float) -> Any:
        return await self.redis.execute_command(*command)

    async def pipeline(
        self,
        key: str,
        commands: list[tuple[Any, ...]],
        *,
        watch: int | None = 0,
        wait_s: float = MIGRATION_WAIT_S,
    ) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    async def through_migration(self, call: Callable[[], Awaitable[T]]) -> T:
        return await call()

    async def each_primary(self, read: Callable[..., Awaitable[T]]) -> list[T]:
        return [await read()]

    async def key_per_primary(self, pattern: str) -> list[str]:
        return [pattern % "0"]

    async def primaries(self) -> list[str]:
        return [""]

    def primary_of(self, key: str) -> str:
        return ""

    async def replicas(self) -> dict[str, int]:
        """INFO replication's connected_slaves."""
        info = await self.redis.info("replication")
        where = self.redis.connection_pool.connection_kwargs
        address = where.get("path") or f"{where.get('host')}:{where.get('port')}"
        return {str(address): int(info["connected_slaves"])}

    def where(self, key: str) -> str:
        return ""

    async def mismatched(self) -> bool:
        info = await self.redis.info("cluster")
        return bool(info.get("cluster_enabled"))


class Cluster:
    """A Redis Cluster: each key's slot on one primary (cluster.on_primary)."""

    clustered = True

    def __init__(self, redis: RedisCluster) -> None:
        self.redis = redis

    async def send(self, command: tuple[Any, ...], key: str, *, wait_s: float) -> Any:
        (reply,) = await on_primary(self.redis, key, [command], wait_s=wait_s)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def pipeline(
        self,
        key: str,
        commands: list[tuple[Any, ...]],
        *,
        watch: int | None = 0,
        wait_s: float = MIGRATION_WAIT_S,
    ) -> list[Any]:
        return await on_primary(self.redis, key, commands, watch=watch, wait_s=wait_s)

    async def through_migration(self, call: Callable[[], Awaitable[T]]) -> T:
        reply: T = await wait_out_migration(call)
        return reply

    async def each_primary(self, read: Callable[..., Awaitable[T]]) -> list[T]:
        await self.redis.initialize()  # the node map, if no call has read it yet
        return [await read(target_nodes=node) for node in self.redis.get_primaries()]

    async def key_per_primary(self, pattern: str) -> list[str]:
        await self.redis.initialize()
        wanted = {node.name for node in self.redis.get_primaries()}
        keys: dict[str, str] = {}
        for n in count():
            key = pattern % n
            node = self.redis.get_node_from_key(key)
            if node is not None and node.name in wanted:
                keys.setdefault(node.name, key)
            if len(keys) == len(wanted):
                return list(keys.values())
        raise AssertionError("unreachable")

    async def primaries(self) -> list[str]:
        await self.redis.initialize()
        return sorted(node.name for node in self.redis.get_primaries())

    def primary_of(self, key: str) -> str:
        node = self.redis.get_node_from_key(key)
        return "" if node is None else str(node.name)

    async def replicas(self) -> dict[str, int]:
        """The cluster's own view (CLUSTER NODES): a replica flagged failing does not
        count, a primary without slots serves nothing."""
        nodes = await self.redis.cluster_nodes()
        primaries = {
            str(node["node_id"]): address
            for address, node in nodes.items()
            if _healthy(str(node["flags"]), "master") and node["slots"]
        }
        counts = dict.fromkeys(primaries.values(), 0)
        for node in nodes.values():
            if _healthy(str(node["flags"]), "slave") and str(node["master_id"]) in primaries:
                counts[primaries[str(node["master_id"])]] += 1
        return counts

    def where(self, key: str) -> str:
        return f" (primary of {key})"

    async def mismatched(self) -> bool:
        return False


def _healthy(flags: str, role: str) -> bool:
    """Whether a CLUSTER NODES line's flags say `role`, and that the node is up."""
    found = set(flags.split(","))
    return role in found and not found & {"fail", "fail?", "handshake", "noaddr"}


def failover_shortfall(replicas: Mapping[str, int], wait_replicas: int) -> str:
    """Why one failure would stop admissions ("" if none would), and what to change.

    Every admission waits for `wait_replicas` replicas (IRREV_WAIT_REPLICAS) of the
    primary that ran it. A primary with r replicas has r - 1 left when one of them
    dies, and its new primary has r - 1 when a failover promotes one: fewer than
    `wait_replicas`, and every admission there fails closed (503 not_replicated)
    until a replica is back. So each primary (`replicas`: its address -> how many
    replicas it has now) needs `wait_replicas` + 1."""
    if wait_replicas <= 0:
        return ""
    needed = wait_replicas + 1
    short = sorted((address, count) for address, count in replicas.items() if count < needed)
    if not short:
        return ""
    listed = ", ".join(
        f"{address} has {count}" + (" (short already)" if count < wait_replicas else "")
        for address, count in short
    )
    return (
        f"IRREV_WAIT_REPLICAS={wait_replicas} needs {needed} replicas per primary to "
        f"survive one failure and {listed}: when one of its replicas dies or is promoted "
        f"by a failover, fewer than {wait_replicas} are left to acknowledge and every "
        f"admission there fails closed (not_replicated) until it is back; give each "
        f"primary {needed} replicas, or lower IRREV_WAIT_REPLICAS"
    )
