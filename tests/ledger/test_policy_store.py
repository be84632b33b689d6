"""The fleet's policy store: a write lands only over the version its writer read, so
an old host's copy never overwrites a newer policy; every write bumps the epoch and
is announced to the gateways' feeds (pub/sub)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

from ledger import ChangeFeed, EmbeddedRedis, Ledger
from ledger.changes import CHANNEL
from ledger.cluster import cluster_enabled
from ledger.keys import POLICY_EPOCH_KEY

WAIT_S = 30.0


async def test_a_write_over_an_old_version_loses(ledger: Ledger, tenant: str) -> None:
    store = ledger.policies
    epoch = await store.epoch()
    first = await store.put(
        tenant, expected=0, expected_digest="", digest="a", text="A", origin="h1"
    )
    assert (first.won, first.version) == (True, 1)
    now_ms = await ledger.now_ms()
    assert abs(first.stamp_ms - now_ms) < 60_000  # Redis's clock, never the writer's
    newer = await store.put(
        tenant, expected=1, expected_digest="a", digest="b", text="B", origin="h2"
    )
    assert newer.won and newer.version == 2 and newer.stamp_ms >= first.stamp_ms
    stale = await store.put(
        tenant, expected=1, expected_digest="a", digest="a", text="A", origin="h1"
    )
    assert (stale.won, stale.version, stale.digest) == (False, 2, "b")
    # Version 2 as a failover that lost it had it: its number, another digest.
    lost = await store.put(
        tenant, expected=2, expected_digest="c", digest="d", text="D", origin="h3"
    )
    assert (lost.won, lost.version, lost.digest) == (False, 2, "b")
    record = (await store.records([tenant]))[tenant]
    assert (record.version, record.digest, record.text, record.origin) == (2, "b", "B", "h2")
    assert await store.epoch() >= epoch + 2
    history = await store.history(tenant)
    assert [(r.version, r.text, r.origin) for r in history] == [(2, "B", "h2"), (1, "A", "h1")]
    assert (await store.version(tenant, 1)) == history[1]


async def test_the_same_text_again_is_no_new_version(ledger: Ledger, tenant: str) -> None:
    store = ledger.policies
    first = await store.put(
        tenant, expected=0, expected_digest="", digest="a", text="A", origin="h1"
    )
    again = await store.put(
        tenant, expected=1, expected_digest="a", digest="a", text="A", origin="h2"
    )
    assert (again.won, again.version, again.stamp_ms) == (True, 1, first.stamp_ms)
    assert len(await store.history(tenant)) == 1
    assert await store.records([tenant + "-none"]) == {}


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


def kill_subscribers(url: str) -> int:
    """CLIENT KILL TYPE pubsub on every node (pub/sub is per node); how many died."""
    if cluster_enabled(url):
        cluster = redis.RedisCluster.from_url(url)
        nodes = [redis.Redis(host=n.host, port=n.port) for n in cluster.get_nodes()]
    else:
        nodes = [redis.Redis.from_url(url)]
    return sum(int(node.execute_command("CLIENT", "KILL", "TYPE", "pubsub")) for node in nodes)


async def test_a_feed_hears_each_write_and_counts_a_cut_subscription_as_heard(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """A write through the store (on a cluster: published through any node) is heard;
    a killed subscription counts as heard too (what was published meanwhile is lost),
    and the feed subscribes again by itself."""
    feed = ChangeFeed(redis_url)
    feed.start()
    try:
        await until(lambda: feed.live)
        before = feed.heard("policy")
        await ledger.policies.put(
            tenant, expected=0, expected_digest="", digest="a", text="A", origin="h"
        )
        await until(lambda: feed.heard("policy") > before)
        before = feed.heard("outcomes")
        assert kill_subscribers(redis_url) >= 1
        await until(lambda: feed.heard("outcomes") > before)
        await until(lambda: feed.live)
        before = feed.heard("policy")
        await ledger.policies.put(
            tenant, expected=1, expected_digest="a", digest="b", text="B", origin="h"
        )
        await until(lambda: feed.heard("policy") > before)
    finally:
        await feed.aclose()
    assert not feed.live


async def test_a_feed_on_a_unix_socket_subscribes(tmp_path: Path, tenant: str) -> None:
    """The embedded server `irrev serve` and the demos start listens on a unix socket:
    the feed subscribes there too (TCP keepalive on a unix socket failed every
    connection, and the gateways read the store every refresh instead)."""
    with EmbeddedRedis(tmp_path / "redis") as server:
        assert server.url.startswith("unix://")
        ledger = Ledger.from_url(server.url)
        feed = ChangeFeed(server.url)
        feed.start()
        try:
            await until(lambda: feed.live)
            await ledger.policies.put(
                tenant, expected=0, expected_digest="", digest="a", text="A", origin="h"
            )
            await until(lambda: feed.heard("policy") > 0)
        finally:
            await feed.aclose()
            await ledger.aclose()


async def test_a_message_that_is_not_utf8_does_not_stop_the_feed(
    ledger: Ledger, redis_url: str
) -> None:
    """Whoever can PUBLISH can send bytes that are not UTF-8 on the channel: the feed
    (which decoded what it read) died of UnicodeDecodeError, silently, and every
    later announcement was lost to every gateway until its slow poll."""
    feed = ChangeFeed(redis_url)
    feed.start()
    try:
        await until(lambda: feed.live)
        before = feed.heard("policy")
        await ledger.redis.publish(CHANNEL, b"\xff\xfe not utf-8")
        await ledger.policies.announce("policy")
        await until(lambda: feed.heard("policy") > before)
        await until(lambda: feed.live)
    finally:
        await feed.aclose()


class StallingProxy:
    """A TCP proxy to Redis that can stop carrying the connections it has open without
    closing them, as a proxy or NAT that lost their state does (half-open TCP: no
    FIN, no RST, so the client's socket never errors). Connections made after
    `stall()` are carried."""

    def __init__(self, url: str) -> None:
        self.url = url
        target = urlsplit(url)
        self.target = (target.hostname or "127.0.0.1", target.port or 6379)
        self.server: asyncio.Server | None = None
        self.stalled: list[asyncio.Event] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """The URL to reach Redis through this proxy."""
        self.server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return urlunsplit(urlsplit(self.url)._replace(netloc=f"127.0.0.1:{port}"))

    def stall(self) -> None:
        for event in self.stalled:
            event.set()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        stalled = asyncio.Event()
        self.stalled.append(stalled)
        pumps = [
            asyncio.create_task(_pump(reader, up_writer, stalled)),
            asyncio.create_task(_pump(up_reader, writer, stalled)),
        ]
        self.tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for out in (writer, up_writer):
                with contextlib.suppress(Exception):
                    out.close()


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stalled: asyncio.Event
) -> None:
    while data := await reader.read(65536):
        if not stalled.is_set():  # stalled: read and dropped, never answered
            writer.write(data)
            await writer.drain()


async def test_a_subscription_that_went_silent_counts_as_heard_and_comes_back(
    ledger: Ledger, redis_url: str
) -> None:
    """A path that stopped carrying anything without closing left the feed `live`
    for hours (until the OS keepalive, 7,200 s): every announcement was lost and
    the host read the store only on its slow poll. The feed PINGs its connection;
    no PONG in time is a drop: a gap (heard: the host re-reads), and it subscribes
    again."""
    proxy = StallingProxy(redis_url)
    feed = ChangeFeed(await proxy.start())
    feed.start()
    try:
        await until(lambda: feed.live)
        before = feed.heard("policy")
        proxy.stall()
        await ledger.policies.announce("policy")  # lost on the stalled path
        await until(lambda: feed.heard("policy") > before)
        await until(lambda: feed.live)
        before = feed.heard("policy")
        await ledger.policies.announce("policy")
        await until(lambda: feed.heard("policy") > before)
    finally:
        await feed.aclose()
        await proxy.aclose()


async def test_a_write_that_landed_is_won_though_its_epoch_bump_failed(
    ledger: Ledger, tenant: str
) -> None:
    """The stored write is the outcome: put raised LedgerUnavailable after a write
    that had taken effect when the epoch's INCR failed, and the writer's retry over
    the version it had read then lost the compare-and-set to its own write. (The
    epoch key holding no number makes the INCR fail on a real Redis.)"""
    store = ledger.policies
    epoch = await store.epoch()
    await ledger.redis.set(POLICY_EPOCH_KEY, "not a number")
    try:
        result = await store.put(
            tenant, expected=0, expected_digest="", digest="a", text="A", origin="h"
        )
    finally:
        await ledger.redis.set(POLICY_EPOCH_KEY, epoch + 1)
    assert (result.won, result.version) == (True, 1)
    assert (await store.records([tenant]))[tenant].digest == "a"


async def test_every_epoch_bump_gives_a_value_the_epoch_never_held(ledger: Ledger) -> None:
    """Each bump moves an epoch past both its last value and Redis's clock (in us):
    a primary that lost the last bump in a failover does not give its value again
    (tests/gateway/test_failover_epochs.py). A host of an older release still bumps
    it with INCR."""
    store = ledger.policies
    seen = [await store.epoch(), (await store.epochs())[1], await ledger.keys.epoch()]
    for _ in range(3):
        await store.bump()
        await store.bump_outcomes()
        await ledger.keys.bump()
        now = [await store.epoch(), (await store.epochs())[1], await ledger.keys.epoch()]
        assert all(b > a for a, b in zip(seen, now, strict=True)), (seen, now)
        seen = now
    redis_us = (await ledger.now_ms()) * 1000
    assert all(epoch > redis_us - 60_000_000 for epoch in seen)
    assert await ledger.redis.incr(POLICY_EPOCH_KEY) > seen[0]
