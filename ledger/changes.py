"""Announcements that the policy store's epochs moved, by Redis pub/sub, so an idle
gateway need not read them every refresh: the Redis load of watching for policy
changes is one subscriber connection per process, not one read per process per
refresh interval.

Whoever bumps an epoch (PolicyStore.put, PolicyStore.bump_outcomes) publishes on
CHANNEL right after what changed ('policy', 'outcomes'); a process that gives up
leases at shutdown announces 'lease', so the others ask for them at once. A
`ChangeFeed` is one process's subscription: `heard(kinds)` counts what it heard; a
host re-reads the epochs when that moved since its last look.

Pub/sub is at most once: a message published while a subscriber is disconnected
(killed by CLIENT KILL, Redis restarted, the output buffer limit hit) is lost. So
every (re)subscription counts as heard, of every kind (the host re-reads the epochs once it is
subscribed again, which catches what it missed), `live` is False while not
subscribed (the host then reads the epochs every refresh, as without a feed), and
the host still reads them every so often whatever it heard (a connection that died
silently, a writer that died between its write and its announcement).

On Redis Cluster the feed subscribes on the node of its URL with plain SUBSCRIBE: a
cluster delivers every PUBLISH to the subscribers of every node, which works on
Redis 6.2 and 7 and with any redis-py. (Sharded SSUBSCRIBE, Redis 7 only, would
reach only the shard that owns the channel's slot and need following it across
reshards; a policy write is rare, so broadcasting it costs nothing that matters.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .cluster import RedisClient
from .errors import translate_redis_errors

log = logging.getLogger("irrev.ledger")
CHANNEL = "irrev:{fleet}:changes"
# Waits between attempts to subscribe again, doubling up to the last.
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


async def announce(redis: RedisClient, what: str) -> None:
    """Tell every subscribed gateway that `what` ('policy', 'outcomes', 'lease')
    changed."""
    with translate_redis_errors("announcing a change"):
        await redis.publish(CHANNEL, what)


class ChangeFeed:
    """One process's subscription to CHANNEL, on its own connection (a subscribed
    connection can send nothing else). `start()` it once; `aclose()` at shutdown."""

    def __init__(self, url: str) -> None:
        self.url = url
        # By the message's bytes: what is published is not ours to trust, and a
        # message that is not UTF-8 must not stop the feed.
        self._counts: dict[bytes, int] = {}
        # Times a message may have been missed: every kind counts them as heard.
        self._gaps = 0
        self._live = False
        self._task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        """Subscribed now: an announcement made now reaches this process."""
        return self._live

    def heard(self, *kinds: str) -> int:
        """Announcements of `kinds` heard so far, plus every (re)subscription: moved
        since a look, something may have changed."""
        return self._gaps + sum(self._counts.get(kind.encode(), 0) for kind in kinds)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(_ended)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._live = False

    async def _run(self) -> None:
        failures = 0
        while True:
            redis: Redis | None = None
            pubsub = None
            try:
                # Reconnecting is this loop's job, not redis-py's: its own retry would
                # resubscribe behind our back (still seen, as a new confirmation) but
                # with its own backoff of up to seconds. Bytes, not decoded: anyone
                # who can PUBLISH could otherwise kill the feed with one message.
                redis = Redis.from_url(
                    self.url,
                    decode_responses=False,
                    retry=Retry(NoBackoff(), 0),
                    socket_keepalive=True,
                )
                pubsub = redis.pubsub()
                await pubsub.subscribe(CHANNEL)
                async for message in pubsub.listen():
                    if message["type"] == "subscribe":
                        if failures:
                            log.info("policy change feed subscribed again")
                        failures = 0
                        self._live = True
                        self._gaps += 1
                    elif message["type"] == "message" and isinstance(message["data"], bytes):
                        kind = message["data"]
                        self._counts[kind] = self._counts.get(kind, 0) + 1
                raise redis_errors.ConnectionError("the subscription ended")
            except Exception as exc:
                # Any failure, not only Redis's: the feed must outlive whatever it
                # meets (it runs unwatched for the process's life), so it counts a
                # gap, says so once, backs off and subscribes again.
                self._live = False
                self._gaps += 1
                if failures == 0:
                    log.warning(
                        "policy change feed lost; reading the policy store every refresh "
                        "until it is back",
                        extra={"why": f"{type(exc).__name__}: {exc}"},
                    )
                await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1
            finally:
                self._live = False
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                if redis is not None:
                    with contextlib.suppress(Exception):
                        await redis.aclose()


def _ended(task: asyncio.Task[None]) -> None:
    """Say so if a feed's task ever ends other than by aclose(): its process then
    hears no announcement and reads the store only on its slow poll."""
    if task.cancelled():
        return
    log.error(
        "policy change feed stopped; policy changes now reach this process only by its slow poll",
        exc_info=task.exception(),
    )
