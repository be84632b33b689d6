"""Announcements that the policy store's epochs moved, by Redis pub/sub, so an idle
gateway need not read them every refresh: the Redis load of watching for policy
changes is one subscriber connection per process, not one read per process per
refresh interval.

Whoever bumps an epoch (PolicyStore.put, PolicyStore.bump_outcomes, KeyStore's
writes: `tell`) publishes on CHANNEL right after what changed ('policy', 'outcomes',
'keys'); a process that gives up leases at shutdown announces 'lease', so the others
ask for them at once, and so does the fleet's watcher when it finds a lease lapsed.
A `ChangeFeed` is one process's subscription: `heard(kinds)` counts what it heard; a
host re-reads the epochs when that moved since its last look.

The fleet's watcher (ledger/lease.py Watch, gateway/state/fleetwatch.py: one process of
the fleet) publishes 'beat' every BEAT_S. A process that heard one within
WATCH_LAPSE_S is `watched`: the fleet-wide checks are being done for it (a lost
announcement re-made, a lost epoch bump made, a lapsed lease announced), so it need
not poll for itself; one that is not does its own polling, as before there was a
watcher, and asks for the watch.

Pub/sub is at most once: a message published while a subscriber is disconnected
(killed by CLIENT KILL, Redis restarted, the output buffer limit hit) is lost. So
every (re)subscription counts as heard, of every kind (the host re-reads the epochs once it is
subscribed again, which catches what it missed), `live` is False while not
subscribed (the host then reads the epochs every refresh, as without a feed), a
connection that died silently (half-open TCP) is found by a PING after PING_S with
nothing heard (the watcher's beats, more often than that, spare the PING while it
beats) that must be answered within PONG_S, and the epochs are still read every so
often whatever was heard (a writer that died between its write and its
announcement): by the watcher, or by each host while none beats.

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
from importlib.resources import files

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .cluster import RedisClient
from .errors import translate_redis_errors
from .tasks import stop_tasks

log = logging.getLogger("irrev.ledger")
CHANNEL = "irrev:{fleet}:changes"
# What may be announced; anything else published on CHANNEL is not counted (nor kept:
# anyone who can PUBLISH could otherwise grow every gateway's counts without bound).
KINDS = frozenset({b"policy", b"outcomes", b"lease", b"keys", b"beat"})
# Waits between attempts to subscribe again, doubling up to the last.
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
# The subscription is PINGed after this long with nothing heard on it; no PONG
# within PONG_S is a dropped connection. It bounds how long a silently dead
# subscription passes for live (announcements lost) to PING_S + PONG_S. A PING per
# process every few seconds was the one load of an idle fleet that grew with its
# processes: the watcher's beats, heard by every process, now stand in for them.
PING_S = 3.0
PONG_S = 1.0
# The watcher beats this often (less than PING_S, so a beating watcher spares every
# subscriber its PING); a process that heard no beat for WATCH_LAPSE_S counts the
# fleet as unwatched (the watcher died, or its Redis calls fail).
BEAT_S = 2.0
WATCH_LAPSE_S = 3 * BEAT_S


_EPOCH_SOURCE = files("ledger.lua").joinpath("epoch.lua").read_text(encoding="utf-8")


async def bump_epoch(redis: RedisClient, epoch_key: str) -> None:
    """Move the epoch at `epoch_key` to a value it never held (lua/epoch.lua): an
    INCR after a failover that lost the last bump repeats the lost value, and a host
    that read it would take the new contents for the ones it holds."""
    await redis.register_script(_EPOCH_SOURCE)(keys=[epoch_key])


async def announce(redis: RedisClient, what: str) -> None:
    """Tell every subscribed gateway that `what` ('policy', 'outcomes', 'lease',
    'keys') changed."""
    with translate_redis_errors("announcing a change"):
        await redis.publish(CHANNEL, what)


# Waits before trying a failed epoch bump or announcement again (then it is logged).
TELL_RETRY_S = (0.05, 0.2)


async def tell(redis: RedisClient, epoch_key: str, kind: str) -> None:
    """After a write of `kind` ('policy', 'keys') took effect: bump its epoch and
    announce it, each retried a little; a failure is logged, not raised. The stored
    write is the outcome: raising after it took effect sent the writer's retry over
    the version it had read, to lose the compare-and-set to its own write (or, for a
    key, lost the token shown once). A bump lost for good is made by the fleet's
    watcher, which compares every tenant's versions (gateway/state/fleetwatch.py), or
    found by each gateway's full re-read while no watcher beats
    (IRREV_POLICY_FULL_READ_S)."""
    for what, step in (
        (f"bumping the {kind} epoch", lambda: bump_epoch(redis, epoch_key)),
        (f"announcing a {kind} write", lambda: redis.publish(CHANNEL, kind)),
    ):
        for wait_s in (*TELL_RETRY_S, None):
            try:
                await step()
                break
            except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
                if wait_s is None:
                    log.warning(
                        f"{kind} written, but not told: gateways find it by their full re-read",
                        extra={"step": what, "why": f"{type(exc).__name__}: {exc}"},
                    )
                    break
                await asyncio.sleep(wait_s)


class ChangeFeed:
    """One process's subscription to CHANNEL, on its own connection (a subscribed
    connection can send nothing else). `start()` it once; `aclose()` at shutdown."""

    # The watcher (gateway/state/fleetwatch.py) paces itself by these.
    BEAT_S = BEAT_S
    WATCH_LAPSE_S = WATCH_LAPSE_S

    def __init__(self, url: str) -> None:
        self.url = url
        # By the message's bytes: what is published is not ours to trust, and a
        # message that is not UTF-8 must not stop the feed.
        self._counts: dict[bytes, int] = {}
        # Times a message may have been missed: every kind counts them as heard.
        self._gaps = 0
        self._live = False
        # Drops in a row: the backoff's step, and whether the drop was said yet.
        self._failures = 0
        self._task: asyncio.Task[None] | None = None
        self._wakeups: dict[bytes, list[asyncio.Event]] = {}
        # Event loop time of the last beat heard on this subscription (None: none yet).
        self._beat_at: float | None = None

    @property
    def live(self) -> bool:
        """Subscribed now: an announcement made now reaches this process."""
        return self._live

    @property
    def watched(self) -> bool:
        """Subscribed, and the fleet's watcher was heard beating within WATCH_LAPSE_S:
        the fleet-wide checks are being done."""
        if not self._live or self._beat_at is None:
            return False
        return asyncio.get_running_loop().time() - self._beat_at < WATCH_LAPSE_S

    def heard(self, *kinds: str) -> int:
        """Announcements of `kinds` heard so far, plus every (re)subscription: moved
        since a look, something may have changed."""
        return self._gaps + sum(self._counts.get(kind.encode(), 0) for kind in kinds)

    def wakeup(self, *kinds: str) -> asyncio.Event:
        """An event set whenever one of `kinds` is heard, and at every
        (re)subscription: what a loop waits on to act at once rather than at its next
        interval (the waiter clears it)."""
        event = asyncio.Event()
        for kind in kinds:
            self._wakeups.setdefault(kind.encode(), []).append(event)
        return event

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(_ended)

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])
        self._live = False

    async def _run(self) -> None:
        while True:
            redis: Redis | None = None
            pubsub = None
            try:
                # Reconnecting is this loop's job, not redis-py's: its own retry would
                # resubscribe behind our back (still seen, as a new confirmation) but
                # with its own backoff of up to seconds. Bytes, not decoded: anyone
                # who can PUBLISH could otherwise kill the feed with one message.
                # TCP keepalive is a TCP socket option: redis-py's unix socket
                # connection refuses it (TypeError on every connect).
                redis = Redis.from_url(
                    self.url,
                    decode_responses=False,
                    retry=Retry(NoBackoff(), 0),
                    **({} if self.url.startswith("unix:") else {"socket_keepalive": True}),
                )
                pubsub = redis.pubsub()
                await pubsub.subscribe(CHANNEL)
                await self._listen(pubsub)
            except Exception as exc:
                # Any failure, not only Redis's: the feed must outlive whatever it
                # meets (it runs unwatched for the process's life), so it counts a
                # gap, says so once, backs off and subscribes again.
                self._live = False
                self._gaps += 1
                if self._failures == 0:
                    log.warning(
                        "policy change feed lost; reading the policy store every refresh "
                        "until it is back",
                        extra={"why": f"{type(exc).__name__}: {exc}"},
                    )
                await asyncio.sleep(RETRY_S[min(self._failures, len(RETRY_S) - 1)])
                self._failures += 1
            finally:
                self._live = False
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                if redis is not None:
                    with contextlib.suppress(Exception):
                        await redis.aclose()

    async def _listen(self, pubsub: PubSub) -> None:
        """Count what the subscription hears until it fails; PING it every PING_S and
        take no PONG within PONG_S for a drop: a path that stops carrying anything
        without closing (half-open TCP behind a proxy or NAT) raises no error for as
        long as the OS keepalive (7,200 s by default), and meanwhile every
        announcement would be lost while the feed claimed to be live. (redis-py's
        health_check_interval pings only when a read starts, never during the wait
        for the next message, so it cannot notice this.)"""
        loop = asyncio.get_running_loop()
        ping_at = loop.time() + PING_S
        pong_by: float | None = None
        self._beat_at = None
        while True:
            now = loop.time()
            if pong_by is not None and now >= pong_by:
                raise redis_errors.ConnectionError(
                    f"no PONG within {PONG_S} s: the subscription's connection is dead"
                )
            if pong_by is None and now >= ping_at:
                await pubsub.ping()
                pong_by = now + PONG_S
            wait = (ping_at if pong_by is None else pong_by) - now
            message = await pubsub.get_message(timeout=max(wait, 0.0))
            if message is None:
                continue
            # Whatever arrived, the connection carries messages: no PING is owed for
            # PING_S more.
            pong_by, ping_at = None, loop.time() + PING_S
            if message["type"] == "subscribe":
                if self._failures:
                    log.info("policy change feed subscribed again")
                self._failures = 0
                self._live = True
                self._gaps += 1
                for events in self._wakeups.values():
                    for event in events:
                        event.set()
            elif message["type"] == "message" and message["data"] in KINDS:
                kind = message["data"]
                self._counts[kind] = self._counts.get(kind, 0) + 1
                for woken in self._wakeups.get(kind, ()):
                    woken.set()
                if kind == b"beat":
                    self._beat_at = loop.time()


def _ended(task: asyncio.Task[None]) -> None:
    """Say so if a feed's task ever ends other than by aclose(): its process then
    hears no announcement and reads the store only on its slow poll."""
    if task.cancelled():
        return
    log.error(
        "policy change feed stopped; policy changes now reach this process only by its slow poll",
        exc_info=task.exception(),
    )
