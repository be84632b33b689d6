"""A worker's keyring (gateway/state/keyring.py) on a real Redis, driven by a fake monotonic
clock: a key's expiry is judged by Redis's clock carried on the monotonic one (the
host's wall clock plays no part), a reload follows what the epoch says, and the uses
noted are written in one flush."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from gateway.state.keyring import Keyring
from ledger import KeyKind, KeySpec, Ledger

from .helpers import FakeClock

AGENT = KeySpec(kind=KeyKind.AGENT, agent="buyer-01", owner="o")
POLL_S = 30.0


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


async def create(ledger: Ledger, tenant: str, life_ms: int | None = None) -> tuple[str, str]:
    key_id, token_hash = "key_" + secrets.token_hex(6), "sha256:" + secrets.token_hex(32)
    assert await ledger.keys.create(tenant, key_id, token_hash, AGENT, life_ms) is not None
    return key_id, token_hash


async def test_expiry_is_judged_on_redis_time_carried_by_the_monotonic_clock(
    ledger: Ledger, tenant: str
) -> None:
    clock = FakeClock()
    ring = Keyring(clock)
    _, token_hash = await create(ledger, tenant, life_ms=60_000)
    await ring.reload(ledger, frozenset({tenant}))
    record = (await ledger.keys.records([tenant]))[tenant][0]
    assert record.expires_ms is not None
    # The ring's Redis time now is within a round trip of the record's creation.
    assert 0 <= ring.now_ms() - record.created_ms < 5_000
    left_s = (record.expires_ms - ring.now_ms()) / 1000
    clock.now += left_s - 1
    assert ring.find(token_hash) is not None
    clock.now += 2
    assert ring.find(token_hash) is None


async def test_a_reload_follows_the_epoch_and_the_tenants(ledger: Ledger, tenant: str) -> None:
    clock = FakeClock()
    ring = Keyring(clock)
    key_id, token_hash = await create(ledger, tenant)
    assert await ring.refresh(ledger, [tenant], None, POLL_S, 3600.0)
    found = ring.find(token_hash)
    assert found is not None and (found.key_id, found.member) == (key_id, "buyer-01")
    assert not await ring.refresh(ledger, [tenant], None, POLL_S, 3600.0)  # nothing moved
    await ledger.keys.revoke(tenant, key_id)
    assert await ring.refresh(ledger, [tenant], None, POLL_S, 3600.0)  # the epoch moved
    assert ring.find(token_hash) is None
    _, other = await create(ledger, tenant + "-b")
    assert ring.find(other) is None
    assert await ring.refresh(ledger, [tenant, tenant + "-b"], None, POLL_S, 3600.0)
    assert ring.find(other) is not None


async def test_uses_are_written_in_one_flush(ledger: Ledger, tenant: str) -> None:
    ring = Keyring(FakeClock())
    _, token_hash = await create(ledger, tenant)
    await ring.reload(ledger, frozenset({tenant}))
    found = ring.find(token_hash)
    assert found is not None
    ring.used(found)
    assert (await ledger.keys.records([tenant]))[tenant][0].last_used_ms is None
    await ring.flush(ledger)
    (record,) = (await ledger.keys.records([tenant]))[tenant]
    assert record.last_used_ms == ring.now_ms()
