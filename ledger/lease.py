"""A lease: one holder at a time of a piece of background work (a tenant's sweep, its
event dispatch), so that work costs Redis O(tenants), not O(processes x tenants).

`Lease(redis, key, ttl_ms)`; call `hold()` before each round of the work: it takes
the lease while free or renews it while this holder has it (one round trip, a Lua
script comparing the holder's token, so a holder never renews a lease someone else
took after it lapsed), and says whether to do the round. `held` tells, between
rounds, whether the lease is still surely this holder's: it counts on 0.8 x
`ttl_ms` from when the call that renewed it *was sent*, measured on this process's
monotonic clock (a duration, so a wall clock set wrong does not move it).
`Ledger.lease(tenant, work, ttl_ms)` builds one on the tenant's key. `release()` frees it at
shutdown so another holder need not wait for the lapse.

A lease bounds load, not correctness: a holder paused past its ttl (GC, SIGSTOP)
may overlap the next one for a round. What the ledger's background work writes is
decided inside its scripts on Redis time, so two rounds at once are harmless, only
wasted.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from importlib.resources import files
from typing import Any

from redis.commands.core import AsyncScript

from .changes import CHANNEL
from .cluster import RedisClient
from .errors import BadInput, translate_redis_errors
from .keys import WATCH_LEASE_KEY
from .topology import topology_of

# Of a lease's ttl, the part its holder counts on: Redis lapses it on its own clock,
# which may run apart from this process's (one test saw a 50 ms lease gone before
# 50 ms had passed here).
SURE_FRACTION = 0.8


def _script(name: str) -> str:
    return files("ledger.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def holder_name() -> str:
    """Who this process is, as a lease records it: host and pid (for an operator
    reading the key), with a random suffix that makes it unique per Lease."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    def __init__(self, redis: RedisClient, key: str, ttl_ms: int, *, holder: str = "") -> None:
        if not 0 < ttl_ms <= 24 * 3600 * 1000:
            raise BadInput("ttl_ms", "a lease lasts 1 ms to a day")
        self.redis = redis
        self.topology = topology_of(redis)
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = f"{holder or holder_name()}:{secrets.token_hex(6)}"
        self._hold = redis.register_script(_script("lease"))
        self._release = redis.register_script(_script("lease_release"))
        self._until = 0.0

    @property
    def held(self) -> bool:
        """Whether this holder surely still has the lease (not yet lapsed)."""
        return time.monotonic() < self._until

    async def hold(self) -> bool:
        """Take the lease if free, renew it if this holder has it; True if held now.
        LedgerUnavailable if Redis cannot be asked (then it counts as not held)."""
        sent = time.monotonic()
        self._until = 0.0
        reply = await self._call(self._hold, [self.token, str(self.ttl_ms)], "taking a lease")
        if int(reply) == 1:
            self._until = sent + self.ttl_ms * SURE_FRACTION / 1000
        return self.held

    async def release(self) -> bool:
        """Free the lease if this holder has it; True if it did."""
        self._until = 0.0
        return int(await self._call(self._release, [self.token], "releasing a lease")) == 1

    async def holder(self) -> str | None:
        """The token of whoever holds the lease now, None if it is free."""
        with translate_redis_errors("reading a lease"):
            value = await self.redis.get(self.key)
        return value.decode() if isinstance(value, bytes) else value

    async def _call(self, script: AsyncScript, args: list[str], operation: str) -> Any:
        with translate_redis_errors(operation):
            return await self.topology.through_migration(lambda: script(keys=[self.key], args=args))


class Watch:
    """The fleet's watch: one process at a time does the checks every process once
    did for itself (gateway/state/fleetwatch.py). `beat()` takes the watch while it is
    free or renews it while this process has it and, if held, publishes 'beat' on
    the change feed (one script, lua/watch.lua): subscribers take the beats both as
    word that the checks are being done and as proof that their subscription still
    carries messages (ledger/changes.py)."""

    def __init__(self, redis: RedisClient, ttl_ms: int, *, holder: str = "") -> None:
        if not 0 < ttl_ms <= 24 * 3600 * 1000:
            raise BadInput("ttl_ms", "a watch lasts 1 ms to a day")
        self.redis = redis
        self.topology = topology_of(redis)
        self.ttl_ms = ttl_ms
        self.token = f"{holder or holder_name()}:{secrets.token_hex(6)}"
        self._beat = redis.register_script(_script("watch"))
        self._release = redis.register_script(_script("lease_release"))

    async def beat(self) -> bool:
        """Take or keep the watch and beat; whether this process holds it now."""
        reply = await self._call(self._beat, [self.token, str(self.ttl_ms), CHANNEL], "beating")
        return int(reply) == 1

    async def release(self) -> bool:
        """Give the watch up (at shutdown), if this process has it: another process
        takes it once it hears no beat, without waiting for the ttl too."""
        return int(await self._call(self._release, [self.token], "releasing")) == 1

    async def _call(self, script: AsyncScript, args: list[str], doing: str) -> Any:
        with translate_redis_errors(f"{doing} the fleet's watch"):
            return await self.topology.through_migration(
                lambda: script(keys=[WATCH_LEASE_KEY], args=args)
            )
