"""What the ledger's Redis does to keep a write: its persistence settings, read with
CONFIG GET at start (a managed Redis may refuse CONFIG: then they are unknown), and
whether that meets what the gateway is told to require."""

from __future__ import annotations

from dataclasses import dataclass

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from .cluster import RedisClient

PARAMETERS = ("appendonly", "appendfsync", "min-replicas-to-write")
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Durability:
    """The server's settings as read ("unknown" where CONFIG GET was refused; on a
    cluster, every primary's value, "a|b" where they differ)."""

    appendonly: str
    appendfsync: str
    min_replicas_to_write: str

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


async def read_durability(redis: RedisClient) -> Durability:
    values = [await _config(redis, name) for name in PARAMETERS]
    return Durability(*values)


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
