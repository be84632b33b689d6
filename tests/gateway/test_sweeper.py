"""One tenant's failing sweep or lease (its cluster shard down, a key of the wrong
type) must not stop the round: the tenants after it in the round kept their leases
only as long as nothing raised before them, so one broken tenant left every later
one unswept and its lease lapsing to another process, every round."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from gateway.state.sweeper import Sweeper
from ledger import Ledger
from ledger.keys import lease_key


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


def failures_logged(caplog: pytest.LogCaptureFixture) -> int:
    return sum("sweep failed" in record.getMessage() for record in caplog.records)


async def test_a_tenant_whose_lease_fails_leaves_the_others_swept(
    ledger: Ledger, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    broken, fine = f"{tenant}-broken", f"{tenant}-fine"
    # A hash where the lease's string should be: every lease call on it fails
    # (WRONGTYPE), as it would with the tenant's shard down.
    await ledger.redis.hset(lease_key(broken, "sweep"), "not", "a lease")
    sweeper = Sweeper(ledger, interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="irrev.gateway"):
        assert await sweeper.round([broken, fine]) == 1
        assert sweeper.holds(fine) and not sweeper.holds(broken)
        assert await sweeper.round([broken, fine]) == 1
        assert failures_logged(caplog) == 1  # once per outage, not once per round
        await ledger.redis.delete(lease_key(broken, "sweep"))
        assert await sweeper.round([broken, fine]) == 2
        assert sweeper.holds(broken)
        assert any("sweep back" in record.getMessage() for record in caplog.records)


async def test_a_lapsed_lease_is_taken_by_the_next_scrape(ledger: Ledger, tenant: str) -> None:
    """A tenant's fleet gauges come from the gateway whose worker holds its sweep
    lease. When the lease lapsed (its holder's loop held up past the ttl on a loaded
    machine) or no round had taken it yet, no gateway reported them: gauges gone from
    every scrape until a sweep round took the lease again. Now the scrape takes it."""
    first, second = Sweeper(ledger, 1.0, "gw-a"), Sweeper(ledger, 1.0, "gw-b")
    assert await second.reporting([tenant]) == [tenant]  # before any round
    assert await first.reporting([tenant]) == []
    await ledger.redis.delete(lease_key(tenant, "sweep"))  # lapsed
    assert await first.reporting([tenant]) == [tenant]
    assert await second.reporting([tenant]) == []
    assert first.holds(tenant) and await first.round([tenant]) == 1
    assert await second.round([tenant]) == 0  # one sweeper still

    alone = Sweeper(ledger, 1.0)  # a gateway without an instance name
    await ledger.redis.delete(lease_key(tenant, "sweep"))
    assert await alone.reporting([tenant]) == [tenant]
    assert await first.reporting([tenant]) == []


async def test_a_lease_that_cannot_be_read_or_taken_hides_only_its_tenant(
    ledger: Ledger, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A scrape reports the tenants this gateway sweeps. One tenant whose lease
    fails (here a key of the wrong type, as with its shard down) made the whole
    scrape report none: the gauges of every tenant gone with it. Its own gauges go
    missing, which is said once per outage (an absent series reads as a quiet
    tenant; before, nothing said it)."""
    held, broken, free = f"{tenant}-held", f"{tenant}-broken", f"{tenant}-free"
    sweeper = Sweeper(ledger, 1.0, "gw-a")
    assert await sweeper.round([held]) == 1
    await ledger.redis.hset(lease_key(broken, "sweep"), "not", "a lease")

    def said(text: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if text in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="irrev.gateway"):
        assert await sweeper.reporting([held, broken, free]) == [held, free]
        assert await sweeper.reporting([held, broken, free]) == [held, free]
        [missing] = said("fleet gauges not reported")
        assert missing.__dict__["tenant"] == broken and "WRONGTYPE" in missing.__dict__["why"]
        await ledger.redis.delete(lease_key(broken, "sweep"))
        assert await sweeper.reporting([held, broken, free]) == [held, broken, free]
        [back] = said("fleet gauges reported again")
        assert back.__dict__["tenant"] == broken
