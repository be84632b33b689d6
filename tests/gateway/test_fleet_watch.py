"""The fleet's watcher (gateway/state/fleetwatch.py): one process does the checks every
process once did for itself, so an idle fleet's Redis load does not grow with its
processes. What each check exists for still happens, each test on a Redis of its
own (the watch is one key per Redis):

- a lease whose holder died is announced, and taken by a process that, while
  watched, never asks on its own;
- a policy write whose epoch bump was lost, or whose announcement was lost, reaches
  a host that no longer re-reads the store unasked;
- with real `irrev serve` processes: the host that held the watch and every lease
  SIGKILLed (supervisor and worker), the other host takes the watch, then the leases.

Each is driven look by look (the watcher's `round`), not timed: how often the
watcher looks (CHECK_S, IRREV_POLICY_POLL_S, IRREV_POLICY_FULL_READ_S) is then the
bound, as documented."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import pytest
import redis
import yaml

from gateway.state.fleetwatch import FleetWatch
from gateway.state.keyring import Keyring
from gateway.state.policy_changes import StoreVersion
from gateway.state.sweeper import Sweeper
from ledger import AccountSpec, ChangeFeed, EmbeddedRedis, KeyKind, KeySpec, Ledger
from ledger.keys import (
    POLICY_EPOCH_KEY,
    TENANTS_KEY,
    WATCH_LEASE_KEY,
    key_hashes_key,
    keys_version_key,
    lease_key,
    managed_keys_key,
    policy_key,
    policy_log_key,
    policy_sources_key,
)

from .helpers import FakeClock, loaded_store, write_without_epoch_bump
from .servers import BIN, Server, base_env, write_policy

WAIT_S = 30.0
# Far beyond any wait here: a store that learns of a write learnt it from the watcher.
POLL_S = 3600.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    with EmbeddedRedis(tmp_path / "redis", tcp=True) as server:
        yield server.url


@pytest.fixture
async def ledger(own_redis: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(own_redis)
    yield ledger
    await ledger.aclose()


async def until(what: str, done: Callable[[], bool | Awaitable[bool]]) -> None:
    """Wait for `done` (a hang guard, not a bound: the bounds are the looks)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        outcome = done()
        if outcome if isinstance(outcome, bool) else await outcome:
            return
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def started(url: str) -> ChangeFeed:
    feed = ChangeFeed(url)
    feed.start()
    await until("the feed subscribed", lambda: feed.live)
    return feed


async def heard_after(ledger: Ledger, feed: ChangeFeed) -> None:
    """Wait until `feed` heard everything published before this call: a sentinel
    published now reaches it after them (Redis delivers in the order it ran them)."""
    sentinel = feed.heard("outcomes")
    await ledger.policies.announce("outcomes")
    await until("the sentinel heard", lambda: feed.heard("outcomes") > sentinel)


@dataclass
class Watched:
    """A host's feed and the fleet's watcher (on a feed of its own), its first look made
    and its beats heard by the host's feed."""

    feed: ChangeFeed
    watch: FleetWatch

    async def look(self, ledger: Ledger) -> None:
        """One look of the watcher, and what it published heard by the host's feed."""
        await self.watch.round()
        await heard_after(ledger, self.feed)


@asynccontextmanager
async def watched(ledger: Ledger, url: str) -> AsyncIterator[Watched]:
    feed, watcher_feed = await started(url), await started(url)
    watch = FleetWatch(ledger, watcher_feed, 0.0, 0.0)
    try:
        await watch.round()  # a new watcher's first look: announces, bumps
        await until("beats heard", lambda: feed.watched)
        await heard_after(ledger, feed)
        yield Watched(feed, watch)
    finally:
        await watch.aclose()
        await feed.aclose()
        await watcher_feed.aclose()


async def test_a_lapsed_lease_is_announced_and_taken_by_a_process_that_does_not_ask(
    ledger: Ledger, own_redis: str, tenant: str
) -> None:
    await ledger.redis.sadd(TENANTS_KEY, tenant)
    feeds = [await started(own_redis) for _ in range(3)]
    watch = FleetWatch(ledger, feeds[0], POLL_S, POLL_S, check_s=0.0)
    try:
        await watch.round()
        assert watch.holding
        await until("beats heard", lambda: all(feed.watched for feed in feeds[1:]))
        holder = Sweeper(ledger, 1.0, "gw-a", feed=feeds[1])
        other = Sweeper(ledger, 1.0, "gw-b", feed=feeds[2])
        assert await holder.round([tenant]) == 1
        assert await other.round([tenant]) == 0
        await watch.round()  # sees the lease held: nothing lapsed since
        await heard_after(ledger, feeds[2])
        lease_heard = feeds[2].heard("lease")

        await ledger.redis.delete(lease_key(tenant, "sweep"))  # its holder died
        # Watched, the other process never asks on its own (before, every process
        # asked for every lease it lacked every 15-30 s).
        assert await other.round([tenant]) == 0
        await watch.round()
        await until("the lapse announced", lambda: feeds[2].heard("lease") > lease_heard)
        assert await other.round([tenant]) == 1
        assert other.holds(tenant)

        # A lease nobody takes (no process serves the tenant) is announced once, not
        # at every look.
        await ledger.redis.delete(lease_key(tenant, "sweep"))
        await watch.round()
        await heard_after(ledger, feeds[2])
        once = feeds[2].heard("lease")
        await watch.round()
        await heard_after(ledger, feeds[2])
        assert feeds[2].heard("lease") == once
    finally:
        await watch.aclose()
        for feed in feeds:
            await feed.aclose()
    assert await ledger.redis.get(WATCH_LEASE_KEY) is None  # given up at close


@pytest.mark.parametrize("lost", ["bump", "announcement"])
async def test_a_revocation_whose_bump_or_announcement_was_lost_is_served_after_a_look(
    ledger: Ledger, own_redis: str, tmp_path: Path, tenant: str, lost: str
) -> None:
    """A host whose feed hears the watcher does not read the store unasked, however
    long (before: every IRREV_POLICY_POLL_S and IRREV_POLICY_FULL_READ_S, each host).
    A write whose epoch bump was lost is found by the watcher's read of every
    version; one bumped but not announced, by its read of the epochs: either way the
    host serves it at its next look after the watcher's."""
    loaded = await loaded_store(ledger, tmp_path, tenant)
    store, token = loaded.store, loaded.token
    async with watched(ledger, own_redis) as watching:
        await store.refresh(ledger, watching.feed, POLL_S, POLL_S)
        record = (await ledger.policies.records([tenant]))[tenant]
        document = yaml.safe_load(record.text)
        del document["agents"][loaded.agent]
        await write_without_epoch_bump(ledger, tenant, yaml.safe_dump(document))
        if lost == "announcement":
            await ledger.redis.incr(POLICY_EPOCH_KEY)
        for _ in range(3):  # the host's own polls and full reads would all be due
            loaded.clock.now += 2 * POLL_S
            await store.refresh(ledger, watching.feed, POLL_S, POLL_S)
            assert store.authenticate(token) is not None
        await watching.look(ledger)
        await store.refresh(ledger, watching.feed, POLL_S, POLL_S)
        assert store.authenticate(token) is None


async def test_a_version_a_failover_lost_and_its_successor_under_its_number_is_served(
    ledger: Ledger, own_redis: str, tmp_path: Path, tenant: str
) -> None:
    """Version 2 is written and served, then lost (the policy keys put back as they
    were at version 1: a failover to a replica without it), and a revocation is
    written as another version 2 whose writer died before its bump. The watcher read
    version 2 before and reads version 2 now: by number alone nothing moved, and a
    host that served the lost version 2 never served the revocation. By number and
    digest it moved: bumped, and served at the host's next look."""
    loaded = await loaded_store(ledger, tmp_path, tenant)
    store = loaded.store
    policy_keys = [policy_key(tenant), policy_log_key(tenant), policy_sources_key(tenant)]
    async with watched(ledger, own_redis) as watching:
        v1 = (await ledger.policies.records([tenant]))[tenant]
        at_v1: dict[str, bytes] = {}
        for key in policy_keys:
            dumped = await ledger.redis.dump(key)
            assert dumped is not None
            at_v1[key] = dumped
        document = yaml.safe_load(v1.text)
        document["accounts"]["tenant"]["limit"] = "4321"
        base = StoreVersion(v1.version, v1.digest)
        await store.upload(ledger, tenant, yaml.safe_dump(document), base, "lost")
        await watching.look(ledger)  # reads version 2
        await store.refresh(ledger, watching.feed, POLL_S, POLL_S)
        served = store.served(tenant)
        assert served is not None and served.version == 2
        for key, dumped in at_v1.items():  # the failover: version 2 never happened
            await ledger.redis.restore(key, 0, dumped, replace=True)
        document = yaml.safe_load(v1.text)
        del document["agents"][loaded.agent]
        await write_without_epoch_bump(ledger, tenant, yaml.safe_dump(document))
        assert (await ledger.policies.records([tenant]))[tenant].version == 2
        await watching.look(ledger)
        await store.refresh(ledger, watching.feed, POLL_S, POLL_S)
        assert store.authenticate(loaded.token) is None


async def test_a_key_revoked_whose_bump_was_lost_is_refused_after_a_look(
    ledger: Ledger, own_redis: str, tenant: str
) -> None:
    """The same for a managed key: a revocation written (keys.lua) without its keys
    epoch bump and announcement is not found by a watched host's own looks, and is
    after the watcher's read of every tenant's keys version."""
    key_id, token_hash = "key_" + secrets.token_hex(6), "sha256:" + secrets.token_hex(32)
    spec = KeySpec(kind=KeyKind.AGENT, agent="buyer-01", owner="o")
    # A tenant the ledger knows (it has accounts): the watcher looks at those.
    await ledger.upsert_account(
        tenant, AccountSpec(account=f"tenant:{tenant}", limit=1, soft_limit=1)
    )
    await ledger.keys.create(tenant, key_id, token_hash, spec)
    clock = FakeClock()
    ring = Keyring(clock)
    async with watched(ledger, own_redis) as watching:
        await ring.refresh(ledger, [tenant], watching.feed, POLL_S, POLL_S)
        assert ring.find(token_hash) is not None
        await ledger.redis.evalsha(
            *await _keys_script(ledger), 3, *_keys_of(tenant), "revoke", key_id
        )
        for _ in range(3):  # the host's own polls and full reads would all be due
            clock.now += 2 * POLL_S
            await ring.refresh(ledger, [tenant], watching.feed, POLL_S, POLL_S)
            assert ring.find(token_hash) is not None
        await watching.look(ledger)
        await ring.refresh(ledger, [tenant], watching.feed, POLL_S, POLL_S)
        assert ring.find(token_hash) is None


async def test_a_key_revoked_after_a_failover_lost_a_key_write_is_refused_after_a_look(
    ledger: Ledger, own_redis: str, tenant: str
) -> None:
    """Key B's creation is read by the watcher, then lost (the keys put back as they
    were before it: a failover to a replica without it), and key A is revoked by a
    writer that died before its bump. As a counter the keys version gave the
    revocation B's number: the watcher saw no move, and the host kept accepting A."""
    spec = KeySpec(kind=KeyKind.AGENT, agent="buyer-01", owner="o")
    await ledger.upsert_account(
        tenant, AccountSpec(account=f"tenant:{tenant}", limit=1, soft_limit=1)
    )
    key_a, hash_a = "key_" + secrets.token_hex(6), "sha256:" + secrets.token_hex(32)
    await ledger.keys.create(tenant, key_a, hash_a, spec)
    before_b = {key: await ledger.redis.dump(key) for key in _keys_of(tenant)}
    ring = Keyring(FakeClock())
    await ledger.keys.create(
        tenant, "key_" + secrets.token_hex(6), "sha256:" + secrets.token_hex(32), spec
    )
    async with watched(ledger, own_redis) as watching:  # its first look reads B's
        await ring.refresh(ledger, [tenant], watching.feed, POLL_S, POLL_S)
        assert ring.find(hash_a) is not None
        for key, dumped in before_b.items():  # the failover: B was never created
            assert dumped is not None
            await ledger.redis.restore(key, 0, dumped, replace=True)
        await ledger.redis.evalsha(
            *await _keys_script(ledger), 3, *_keys_of(tenant), "revoke", key_a
        )
        await watching.look(ledger)
        await ring.refresh(ledger, [tenant], watching.feed, POLL_S, POLL_S)
        assert ring.find(hash_a) is None


async def _keys_script(ledger: Ledger) -> tuple[str]:
    """keys.lua loaded: what a writer that died before telling ran, alone."""
    source = files("ledger.lua").joinpath("keys.lua").read_text(encoding="utf-8")
    return (str(await ledger.redis.script_load(source)),)


def _keys_of(tenant: str) -> list[str]:
    return [managed_keys_key(tenant), key_hashes_key(tenant), keys_version_key(tenant)]


def gateway_on(host: str, policies: Path, url: str, log: Path) -> Server:
    env = base_env(
        IRREV_REDIS_URL=url, IRREV_POLICY_DIR=str(policies), HOOK_SECRET="no receiver checks it"
    )
    server = Server(name=f"gateway {host}", argv=[], env=env, log_path=log, host=host)
    server.argv = [str(BIN / "irrev"), "serve", "--host", host]
    server.argv += ["--port", str(server.port), "--workers", "1"]
    return server


@pytest.mark.slow
async def test_a_sigkilled_watcher_and_lease_holder_is_replaced_by_the_other_host(
    own_redis: str, tmp_path: Path, tenant: str
) -> None:
    """Host A starts alone: it takes the watch and the tenant's sweep and webhook
    leases; host B starts and takes none. A's supervisor and worker are SIGKILLed
    (no release, no announcement): B, which never asks for a lease while it hears
    a watcher, takes the watch once the beats stop, finds the leases lapsed and
    takes them."""
    policies = tmp_path / "policies"
    policies.mkdir()
    # Never called: an idle tenant has no events to deliver.
    webhook = {"url": "http://127.0.0.1:9/hooks", "secret": {"env": "HOOK_SECRET"}}
    written = write_policy(policies, "procurement", tenant, "http://127.0.0.1:9", webhook=webhook)
    store = redis.Redis.from_url(own_redis, decode_responses=True)
    a = gateway_on("127.0.0.2", policies, own_redis, tmp_path / "a.log")
    b = gateway_on("127.0.0.3", policies, own_redis, tmp_path / "b.log")
    leases = [lease_key(written.id, "sweep"), f"irrev:{{{written.id}}}:webhook:lease"]

    def watcher(server: Server) -> int | None:
        """The pid of `server`'s worker if it holds the watch: its token is
        <host>:<address>:<port>/<pid>:<random>."""
        token = store.get(WATCH_LEASE_KEY) or ""
        assert isinstance(token, str)  # decode_responses
        mine = f":{server.port}/" in token
        return int(token.rpartition("/")[2].split(":")[0]) if mine else None

    def held_by(pid: int | None, key: str) -> bool:
        # A sweep lease's token is <instance>/<pid>:<random>, a webhook lease's
        # <host>:<pid>:<random>.
        token = store.get(key) or ""
        assert isinstance(token, str)  # decode_responses
        return re.search(rf"[:/]{pid}:", token) is not None

    try:
        a.start("/readyz")
        await until("A holds the watch", lambda: watcher(a) is not None)
        killed = watcher(a)
        assert killed is not None
        assert all(held_by(killed, key) for key in leases), [store.get(key) for key in leases]
        b.start("/readyz")
        assert a.process is not None
        os.kill(a.process.pid, signal.SIGKILL)  # the supervisor first: none started anew
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        await until("B holds the watch", lambda: watcher(b) is not None)
        survivor = watcher(b)
        await until("B sweeps the tenant", lambda: held_by(survivor, leases[0]))
        print(f"\nB swept the tenant {time.monotonic() - killed_at:.1f} s after A was killed")
        await until("B delivers its webhook", lambda: held_by(survivor, leases[1]))
        print(f"B took its webhook lease {time.monotonic() - killed_at:.1f} s after")
    finally:
        a.stop()
        b.stop()
        store.close()
