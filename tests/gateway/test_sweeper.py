"""One tenant's failing sweep or lease (its cluster shard down, a key of the wrong
type) must not stop the round: the tenants after it in the round kept their leases
only as long as nothing raised before them, so one broken tenant left every later
one unswept and its lease lapsing to another process, every round."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from gateway.sweeper import Sweeper
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
