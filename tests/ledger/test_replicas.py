"""WAIT on the reserve's own connection: a reserve or an approval says how many
replicas acknowledged it, against a real primary and replica (redis-server
processes), before and after the replica is SIGKILLed."""

from __future__ import annotations

import pytest

from ledger.client import Ledger
from ledger.errors import BadInput
from ledger.records import AccountSpec, HoldState

from ..conftest import ReplicatedRedis

HOUR_MS = 3_600_000


async def test_reserve_and_approve_report_acknowledging_replicas(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    ledger = Ledger.from_url(replicated_redis.primary.url, replicas=1, replica_timeout_ms=2000)
    plain = Ledger.from_url(replicated_redis.primary.url)
    try:
        await ledger.upsert_account(
            tenant, AccountSpec("tenant:acme", 10_000, 10_000, approval_threshold=400)
        )
        admitted = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (admitted.state, admitted.replicas) == (HoldState.PENDING, 1)
        escalated = await ledger.reserve(tenant, "k2", "fp", {"tenant:acme": 450}, ttl_ms=HOUR_MS)
        assert escalated.state is HoldState.ESCALATED
        assert (await ledger.approve(tenant, "k2", "ops", ttl_ms=HOUR_MS)).replicas == 1
        assert (
            await plain.reserve(tenant, "k3", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
        ).replicas is None

        replicated_redis.replica.kill()
        lonely = await ledger.reserve(tenant, "k4", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        # The primary still decides and writes; only the caller can refuse to act on it.
        assert (lonely.state, lonely.replicas) == (HoldState.PENDING, 0)
        replay = await ledger.reserve(tenant, "k4", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert replay.replayed and replay.replicas == 0

        replicated_redis.attach()
        back = await ledger.reserve(tenant, "k5", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert back.replicas == 1
        await ledger.redis.script_flush()  # what a restarted Redis has forgotten
        again = await ledger.reserve(tenant, "k6", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
        assert (again.state, again.replicas) == (HoldState.PENDING, 1)
    finally:
        await ledger.aclose()
        await plain.aclose()


@pytest.mark.parametrize(("replicas", "timeout_ms"), [(-1, 100), (65, 100), (1, 0), (1, 60_001)])
def test_replica_settings_are_checked(replicas: int, timeout_ms: int) -> None:
    with pytest.raises(BadInput):
        Ledger.from_url("redis://127.0.0.1:1/0", replicas=replicas, replica_timeout_ms=timeout_ms)
