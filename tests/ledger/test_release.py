"""The fleet's release flag (ledger/release.py): a store an older release served reads
as a rolling upgrade, in which escalations are neither counted nor capped and no idle
account is closed, until `finish`; a new store is this release's from the start.
On a Redis of this module's own (the flag is fleet-wide), emptied before each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ledger import AccountSpec, Escrow, Ledger, Reason
from ledger.embedded import EmbeddedRedis
from ledger.keys import RELEASE_KEY, TENANTS_KEY, accounts_key
from ledger.release import FORMAT, PREVIOUS_FORMAT, BadReleaseFlag

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def own_redis(redis_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedRedis(tmp_path_factory.mktemp("release"), binary=redis_binary, tcp=True) as server:
        yield server.url


@pytest.fixture
async def fresh(own_redis: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(own_redis)
    await ledger.redis.flushall()
    try:
        yield ledger
    finally:
        await ledger.aclose()


async def escalate(ledger: Ledger, hold: str) -> Reason:
    result = await ledger.reserve(
        "t", hold, "fp", {"agent:a1": 10}, ttl_ms=HOUR_MS, escalate_above=1
    )
    return result.reason


async def test_a_new_store_is_this_releases_from_its_first_tenant(fresh: Ledger) -> None:
    await fresh.upsert_account("t", AccountSpec(account="agent:a1", limit=100, soft_limit=100))
    assert await fresh.redis.get(RELEASE_KEY) == str(FORMAT)
    assert fresh.release.upgraded


async def test_a_new_store_split_over_escrow_shards_first_is_this_releases(
    fresh: Ledger, own_redis: str
) -> None:
    """A split registers its tenant and shards: the flag is decided before, or the
    next process would read the store as an older release's and archive nothing."""
    await Escrow.split(fresh, "t", 2)
    later = Ledger.from_url(own_redis)
    try:
        assert await later.release.read() == FORMAT
    finally:
        await later.aclose()


async def test_an_older_releases_store_waits_for_finish(fresh: Ledger, own_redis: str) -> None:
    # What a release before the flag leaves: tenants registered, no flag.
    await fresh.redis.sadd(TENANTS_KEY, "t")
    assert await fresh.release.read() == PREVIOUS_FORMAT
    await fresh.upsert_account(
        "t", AccountSpec(account="agent:a1", limit=10**9, soft_limit=10**9, max_escalations=1)
    )
    # Not counted, so not capped: an older release resolving them would leave them
    # counted for good.
    assert [await escalate(fresh, h) for h in ("a", "b")] == [Reason.APPROVAL_THRESHOLD] * 2
    assert await fresh.redis.hget(accounts_key("t"), "agent:a1|esc") is None
    assert await fresh.close_idle_accounts("t") == (0, 0)

    assert await fresh.release.finish() == PREVIOUS_FORMAT
    later = Ledger.from_url(own_redis)
    try:
        assert await later.release.read() == FORMAT
        assert await escalate(later, "c") is Reason.APPROVAL_THRESHOLD
        assert await escalate(later, "d") is Reason.ESCALATION_CAP
        # Those raised before still resolve without touching the count.
        await later.approve("t", "a", "alice", ttl_ms=HOUR_MS)
        assert await later.redis.hget(accounts_key("t"), "agent:a1|esc") == "1"
    finally:
        await later.aclose()
    assert await fresh.release.finish() == FORMAT  # never lowered, nothing to do


async def test_a_flag_that_is_no_number_is_refused(fresh: Ledger) -> None:
    await fresh.redis.set(RELEASE_KEY, "two")
    with pytest.raises(BadReleaseFlag, match="irrev ledger upgrade finish"):
        await fresh.release.read()
