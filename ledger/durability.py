"""What the ledger's Redis does to keep a write: its persistence settings, read with
CONFIG GET at start (a managed Redis may refuse CONFIG: then they are unknown),
whether it has WAITAOF (COMMAND INFO: Redis 7.2+, Valkey), and whether that meets
what the gateway is told to require."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from .cluster import RedisClient

PARAMETERS = ("appendonly", "appendfsync", "min-replicas-to-write")
UNKNOWN = "unknown"
WAITAOF_SINCE = (7, 2)
# What a write that must be kept waits for besides replicas (Ledger's wait_aof): no
# fsync, the primary's, or the primary's and every counted replica's.
WaitAof = Literal["off", "local", "all"]
WAIT_AOF_MODES: tuple[str, ...] = get_args(WaitAof)


@dataclass(frozen=True, slots=True)
class Durability:
    """The server's settings as read ("unknown" where CONFIG GET was refused; on a
    cluster, every primary's value, "a|b" where they differ)."""

    appendonly: str
    appendfsync: str
    min_replicas_to_write: str
    # "yes" where the server knows WAITAOF, "no" where not (Redis < 7.2).
    waitaof: str = UNKNOWN

    def shortfall(self, wait_replicas: int) -> str:
        """Why an acknowledged write could be lost on a restart ("" if it cannot): AOF
        off, or fsynced by the OS only (`appendfsync no`), or the settings unknown;
        unless `wait_replicas` replicas must acknowledge each admission and limit
        change (IRREV_WAIT_REPLICAS), so a failover keeps it."""
        if wait_replicas > 0:
            return ""
        if UNKNOWN in (self.appendonly, self.appendfsync):
            return "the server's persistence could not be read (CONFIG GET refused)"
        if self.appendonly != "yes":
            return f"appendonly is {self.appendonly}: a restart loses writes since the last save"
        if self.appendfsync not in ("always", "everysec"):
            return f"appendfsync is {self.appendfsync}: a crash loses what the OS had not written"
        return ""

    def wait_aof_refusal(self) -> str:
        """Why WAITAOF 1 (IRREV_WAIT_AOF local or all) could not acknowledge a write here (""
        if it can): every admission would then fail, so a gateway does not start.
        Without WAITAOF the server answers it with an error; with appendonly off
        WAITAOF refuses numlocal 1; with appendfsync no the server never fsyncs
        for it, so every wait runs out. Settings CONFIG GET could not read are
        left to the first write, which fails closed if they fall short."""
        if "no" in self.waitaof.split("|"):
            return "the server has no WAITAOF (it needs Redis 7.2+ or Valkey)"
        if "no" in self.appendonly.split("|"):
            return "appendonly is no: WAITAOF cannot wait for a local fsync"
        if "no" in self.appendfsync.split("|"):
            return "appendfsync is no: the server never fsyncs for WAITAOF, every wait runs out"
        return ""


async def read_durability(redis: RedisClient) -> Durability:
    appendonly, appendfsync, min_replicas = [await _config(redis, name) for name in PARAMETERS]
    return Durability(appendonly, appendfsync, min_replicas, await _has_waitaof(redis))


async def _has_waitaof(redis: RedisClient) -> str:
    """'yes' or 'no' (on a cluster, every primary's answer, "no|yes" where they
    differ): whether the server's Redis version (INFO server's redis_version, which
    Valkey reports as the Redis it is compatible with) is 7.2 or later, the first
    with WAITAOF. (COMMAND INFO would say it directly, but redis-py's parser fails
    on its answer for a command the server lacks.)"""
    try:
        if isinstance(redis, RedisCluster):
            await redis.initialize()
            found = {
                _known(await redis.info("server", target_nodes=node))
                for node in redis.get_primaries()
            }
            return "|".join(sorted(found)) or UNKNOWN
        return _known(await redis.info("server"))
    except redis_errors.ResponseError:
        return UNKNOWN  # INFO not allowed (ACLs)


def _known(info: dict[str, object]) -> str:
    parts = str(info.get("redis_version", "")).split(".")
    if len(parts) < 2 or not all(part.isdigit() for part in parts[:2]):
        return UNKNOWN
    return "yes" if (int(parts[0]), int(parts[1])) >= WAITAOF_SINCE else "no"


async def _config(redis: RedisClient, name: str) -> str:
    try:
        if isinstance(redis, RedisCluster):
            await redis.initialize()  # the node map, if no call has read it yet
            found = set()
            for node in redis.get_primaries():
                reply = await redis.config_get(name, target_nodes=node)
                found.add(str(reply.get(name, UNKNOWN)))
            return "|".join(sorted(found)) or UNKNOWN
        reply = await redis.config_get(name)
        return str(reply.get(name, UNKNOWN))
    except redis_errors.ResponseError:
        return UNKNOWN  # CONFIG renamed or not allowed (managed Redis, ACLs)
