"""How a host learns of policy writes, and says whether it hears of them.

How soon a host serves a policy write it was not told of: a writer that died
between its write (policy_put.lua) and the epoch's INCR, or whose INCR failed, left
the epoch as it was, so only the full re-read of every tenant's record finds the
write. That re-read runs on its own schedule (FULL_READ_S), whatever the epoch
poll's interval: it ran every 15 polls, 450 s at the default 30 s poll, while a
revoked token kept working. Whether every worker hears announcements:
`irrev_policy_feed_live` on /metrics, 0 while one is not subscribed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from gateway.state.loops import policy_loop
from gateway.state.policies import policy_version
from gateway.state.policy_changes import StoreVersion
from gateway.state.tenants import FULL_READ_S, TenantStore
from ledger import ChangeFeed, Escrow, Ledger
from ledger.keys import accounts_key

from .conftest import Gateway
from .helpers import loaded_store, write_without_epoch_bump
from .servers import write_policy

CHECK_S = 2.0  # the default IRREV_POLICY_CHECK_INTERVAL_S
POLL_S = 30.0  # the default IRREV_POLICY_POLL_S
WAIT_S = 30.0


class UnwatchedFeed(ChangeFeed):
    """The feed of a host that hears no fleet watcher beat: the contract under test is
    the one of a host that does its own polling. The session's gateways on the same
    Redis run the fleet's watcher (gateway/state/fleetwatch.py), and a store that hears one
    of its beats (every 2 s) leaves the full read to it, on the watcher's wall-clock
    schedule, which the fake clock here outruns: on a loaded machine a beat arrived
    during the refreshes and the test failed ("still worked 34.0 s after the write")."""

    @property
    def watched(self) -> bool:
        return False


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


@pytest.mark.parametrize("full_read_s", [FULL_READ_S, 5.0])
async def test_a_revocation_whose_epoch_bump_was_lost_is_served_within_the_full_read_interval(
    ledger: Ledger, redis_url: str, tmp_path: Path, tenant: str, full_read_s: float
) -> None:
    """Within the full read interval (IRREV_POLICY_FULL_READ_S) plus one look,
    whether the default or a shorter one, even with the epoch poll far longer."""
    loaded = await loaded_store(ledger, tmp_path, tenant)
    store, clock, agent, token = loaded.store, loaded.clock, loaded.agent, loaded.token
    assert store.authenticate(token) is not None
    feed = UnwatchedFeed(redis_url)
    feed.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not feed.live:
            assert time.monotonic() < deadline, "the feed never subscribed"
            await asyncio.sleep(0.02)
        await store.refresh(ledger, feed, POLL_S, full_read_s)
        record = (await ledger.policies.records([tenant]))[tenant]
        document = yaml.safe_load(record.text)
        del document["agents"][agent]
        await write_without_epoch_bump(ledger, tenant, yaml.safe_dump(document))
        written_at = clock.now
        while store.authenticate(token) is not None:
            assert clock.now - written_at <= full_read_s + CHECK_S, (
                f"the revoked token still worked {clock.now - written_at} s after the write"
            )
            clock.now += CHECK_S
            await store.refresh(ledger, feed, POLL_S, full_read_s)
    finally:
        await feed.aclose()


async def feed_gauge(http: httpx.AsyncClient, gateway: Gateway) -> float | None:
    text = (await http.get("/metrics", headers=gateway.admin)).text
    for line in text.splitlines():
        if line.startswith("irrev_policy_feed_live "):
            return float(line.split()[1])
    return None


async def until_gauge(http: httpx.AsyncClient, gateway: Gateway, value: float) -> None:
    deadline = time.monotonic() + WAIT_S
    while (seen := await feed_gauge(http, gateway)) != value:
        assert time.monotonic() < deadline, f"irrev_policy_feed_live stayed {seen}, not {value}"
        await asyncio.sleep(0.1)


async def test_the_feed_gauge_is_0_while_the_subscription_is_down(gateway: Gateway) -> None:
    """A real `irrev serve` (several workers): 1 while subscribed; 0 once the
    subscriptions are killed and SUBSCRIBE refused; 1 again once they are back. (The
    feed subscribes on the node of its URL, also on a cluster.)"""
    node = redis.Redis.from_url(gateway.redis_url)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        await until_gauge(http, gateway, 1.0)
        try:
            node.execute_command("ACL", "SETUSER", "default", "-subscribe")
            node.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await until_gauge(http, gateway, 0.0)
        finally:
            node.execute_command("ACL", "SETUSER", "default", "+subscribe")
        await until_gauge(http, gateway, 1.0)


async def test_a_stored_version_the_ledger_would_refuse_holds_back_only_its_tenant(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """A version in the store whose accounts the ledger cannot keep (an exact risk
    factor's account past 128 characters: an older irrev's upload, or one whose host
    died before putting the old text back) made every reload fail on the ledger's
    refusal: no other tenant's change, a token's revocation included, was served.
    Now it is a fault of its own tenant, which keeps the policy it had."""
    broken, other = f"{tenant}-broken", f"{tenant}-other"
    written = {
        t: write_policy(tmp_path, "procurement", t, "http://127.0.0.1:9") for t in (broken, other)
    }
    store = TenantStore(tmp_path)
    await store.load(ledger)
    records = await ledger.policies.records([broken, other])

    async def store_version(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        document = yaml.safe_load(records[name].text)
        change(document)
        text = yaml.safe_dump(document)
        put = await ledger.policies.put(
            name,
            expected=records[name].version,
            expected_digest=records[name].digest,
            digest=policy_version(text),
            text=text,
            origin="test",
        )
        assert put.won

    def too_long(document: dict[str, Any]) -> None:
        document["accounts"]["risk_factors"]["supplier:" + "x" * 150] = {"limit": "10"}

    agent, token = next(iter(written[other].tokens.items()))
    kept, kept_token = next(iter(written[broken].tokens.items()))
    await store_version(broken, too_long)
    await store_version(other, lambda document: document["agents"].pop(agent))
    report = await store.apply(ledger)
    # Both files differ from the store's versions (logged, not faults); only the
    # broken tenant's stored version is refused.
    refused = {fault.tenant for fault in report.faults if "128" in str(fault.error)}
    assert refused == {broken}
    assert store.authenticate(token) is None  # the other tenant's revocation is served
    assert store.authenticate(kept_token) is not None  # the broken one's old policy stands
    assert f"{kept}" in store.policies[broken].document.agents


async def test_a_tenant_split_over_escrow_shards_is_not_served_and_holds_back_no_other(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """The gateway does not route holds to escrow shards. Serving a split tenant's
    policy wrote plain accounts beside the escrow's slices, budget no transfer moved
    and no escrow audit counts: up to twice its limits (before the fix). The ledger
    now refuses those accounts, and the tenant is a fault of its own, not served,
    while the other tenants' policies apply."""
    split, other = f"{tenant}-split", f"{tenant}-other"
    await Escrow.split(ledger, split, 3)
    written = {
        t: write_policy(tmp_path, "procurement", t, "http://127.0.0.1:9") for t in (split, other)
    }
    store = TenantStore(tmp_path)
    report = await store.apply(ledger)
    assert [(fault.tenant, "escrow shards" in str(fault.error)) for fault in report.faults] == [
        (split, True)
    ]
    assert report.tenants == [other]
    assert store.authenticate(next(iter(written[split].tokens.values()))) is None
    assert store.authenticate(next(iter(written[other].tokens.values()))) is not None
    assert not await ledger.redis.exists(accounts_key(split))
    assert await ledger.redis.exists(accounts_key(other))


async def test_a_metadata_change_to_an_outdated_copy_does_not_put_it_back(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """A host's file went into the store when its ctime was after the store's
    version, which a chmod, a chown or a new hard link also set: an outdated copy
    whose permissions changed went back into the store, its old limit with it. Only
    an edit of the file's content is a change now, whatever its times say."""
    one, two = tmp_path / "one", tmp_path / "two"
    write_policy(one, "procurement", tenant, "http://127.0.0.1:9")
    two.mkdir()
    (two / f"{tenant}.yaml").write_text((one / f"{tenant}.yaml").read_text())
    first, second = TenantStore(one), TenantStore(two)
    await first.load(ledger)
    await second.load(ledger)
    document = yaml.safe_load((two / f"{tenant}.yaml").read_text())
    document["accounts"]["tenant"]["limit"] = "5000"
    record = (await ledger.policies.records([tenant]))[tenant]
    base = StoreVersion(record.version, record.digest)
    await second.upload(ledger, tenant, yaml.safe_dump(document), base, "test")
    uploaded = (await ledger.policies.records([tenant]))[tenant]
    await first.apply(ledger)  # serves the uploaded version; its own file is outdated
    (one / f"{tenant}.yaml").chmod(0o640)
    await first.apply(ledger)
    assert (await ledger.policies.records([tenant]))[tenant].version == uploaded.version
    limits = {b.account: b.limit for b in await ledger.balances(tenant)}
    assert limits[f"tenant:{tenant}"] == 5000 * 10**6


async def test_a_policy_loop_cancelled_as_it_is_woken_stops() -> None:
    """A worker's shutdown cancels its policy loop, and closing the change feed just
    before may wake it: cancelled while its wait for the wakeup ended, the loop took
    the wakeup and went on, never to stop (asyncio.wait_for in Python 3.11 swallows a
    cancellation that races its awaitable's end). The worker then hung in shutdown
    until its supervisor killed it, 15 s later (seen as `irrev serve` stops that ran
    out Server.stop's 15 s in these tests)."""
    woken = asyncio.Event()
    refreshes: list[float] = []

    async def refresh() -> None:
        refreshes.append(asyncio.get_running_loop().time())

    task = asyncio.create_task(policy_loop(60.0, refresh, woken, lambda: False))
    for _ in range(3):
        await asyncio.sleep(0)  # it starts and waits for a wakeup (or 60 s)
    assert not task.done() and refreshes == []
    woken.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done and task.cancelled(), "the policy loop went on after its cancel"
