"""How soon a host serves a policy write it was not told of: a writer that died
between its write (policy_put.lua) and the epoch's INCR, or whose INCR failed, left
the epoch as it was, so only the full re-read of every tenant's record finds the
write. That re-read runs on its own schedule (FULL_READ_S), whatever the epoch
poll's interval: it ran every 15 polls, 450 s at the default 30 s poll, while a
revoked token kept working."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from gateway.policies import policy_version
from gateway.tenants import FULL_READ_S, TenantStore
from ledger import ChangeFeed, Ledger
from ledger.keys import policy_key

from .servers import write_policy

CHECK_S = 2.0  # the default IRREV_POLICY_CHECK_INTERVAL_S
POLL_S = 30.0  # the default IRREV_POLICY_POLL_S
WAIT_S = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


async def write_without_epoch_bump(ledger: Ledger, tenant: str, text: str) -> None:
    """What a writer that died before its INCR leaves: the script's write alone."""
    record = (await ledger.policies.records([tenant]))[tenant]
    source = files("ledger.lua").joinpath("policy_put.lua").read_text(encoding="utf-8")
    put = ledger.redis.register_script(source)
    args = [str(record.version), policy_version(text), text, "", "a writer that died"]
    won, _, _ = await put(keys=[policy_key(tenant)], args=args)
    assert int(won) == 1


async def test_a_revocation_whose_epoch_bump_was_lost_is_served_within_the_full_read_interval(
    ledger: Ledger, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    written = write_policy(tmp_path, "procurement", tenant, "http://127.0.0.1:9")
    agent, token = next(iter(written.tokens.items()))
    store = TenantStore(tmp_path)
    clock = FakeClock()
    store.clock = clock
    await store.load(ledger)
    assert store.authenticate(token) is not None
    feed = ChangeFeed(redis_url)
    feed.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not feed.live:
            assert time.monotonic() < deadline, "the feed never subscribed"
            await asyncio.sleep(0.02)
        await store.refresh(ledger, feed, POLL_S)
        record = (await ledger.policies.records([tenant]))[tenant]
        document = yaml.safe_load(record.text)
        del document["agents"][agent]
        await write_without_epoch_bump(ledger, tenant, yaml.safe_dump(document))
        written_at = clock.now
        while store.authenticate(token) is not None:
            assert clock.now - written_at <= FULL_READ_S + CHECK_S, (
                f"the revoked token still worked {clock.now - written_at} s after the write"
            )
            clock.now += CHECK_S
            await store.refresh(ledger, feed, POLL_S)
    finally:
        await feed.aclose()
