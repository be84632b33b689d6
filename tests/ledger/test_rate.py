"""Request rates on accounts (issue 26): a GCRA per account in Redis, by Redis's
clock, checked by the reserve itself for effects (nothing written when too early)
and by rate.lua for reads; racing processes get exactly the burst through."""

from __future__ import annotations

import asyncio

import pytest

from ledger import AccountSpec, Ledger, Pace, RateLimited

from .conftest import open_accounts
from .test_concurrency import finish, release, spawn

HOUR_MS = 3_600_000


async def paced_agent(
    ledger: Ledger, tenant: str, effects: Pace, reads: Pace | None = None
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    spec = AccountSpec(
        account="agent:a1", limit=10**9, soft_limit=10**9, effect_pace=effects, read_pace=reads
    )
    await ledger.upsert_account(tenant, spec)


async def reserve(ledger: Ledger, tenant: str, hold: str) -> str:
    amounts = {"tenant:acme": 1, "agent:a1": 1}
    result = await ledger.reserve(tenant, hold, "fp", amounts, ttl_ms=HOUR_MS)
    return result.state.value


async def test_effects_past_the_burst_wait_their_turn(ledger: Ledger, tenant: str) -> None:
    await paced_agent(ledger, tenant, Pace.of(per_second=2, burst=3))
    assert [await reserve(ledger, tenant, f"h{i}") for i in range(3)] == ["pending"] * 3
    with pytest.raises(RateLimited) as early:
        await reserve(ledger, tenant, "h3")
    assert early.value.account == "agent:a1" and 0 < early.value.wait_ms <= 500
    assert await ledger.hold(tenant, "h3") is None  # nothing written
    assert await reserve(ledger, tenant, "h0") == "pending"  # a replay is not a request
    await asyncio.sleep(early.value.wait_ms / 1000)  # the wait the refusal gave
    assert await reserve(ledger, tenant, "h3") == "pending"


async def test_a_policy_change_keeps_the_next_arrival(ledger: Ledger, tenant: str) -> None:
    await paced_agent(ledger, tenant, Pace.of(per_second=1, burst=1))
    assert await reserve(ledger, tenant, "h0") == "pending"
    await ledger.upsert_account(  # reloaded: the same rate, a new window
        tenant,
        AccountSpec(account="agent:a1", limit=10**9, soft_limit=10**9, effect_pace=Pace.of(1, 1)),
    )
    with pytest.raises(RateLimited):
        await reserve(ledger, tenant, "h1")
    no_rate = AccountSpec(account="agent:a1", limit=10**9, soft_limit=10**9)
    await ledger.upsert_account(tenant, no_rate)
    assert await reserve(ledger, tenant, "h1") == "pending"


async def test_reads_have_their_own_rate(ledger: Ledger, tenant: str) -> None:
    await paced_agent(ledger, tenant, Pace.of(100, 100), Pace.of(per_second=1, burst=2))
    await ledger.pace_reads(tenant, ["agent:a1", "tenant:acme"])  # tenant: no rate
    await ledger.pace_reads(tenant, ["agent:a1"])
    with pytest.raises(RateLimited):
        await ledger.pace_reads(tenant, ["agent:a1"])
    assert await reserve(ledger, tenant, "h0") == "pending"  # effects are paced apart


async def test_racing_processes_get_exactly_the_burst(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    spec = AccountSpec(
        account="agent:a1",
        limit=10**9,
        soft_limit=10**9,
        effect_pace=Pace.of(per_second=0.01, burst=5),
    )
    await ledger.upsert_account(tenant, spec)
    processes = [spawn("paced", redis_url, tenant, f"{tenant}-r", "5") for _ in range(4)]
    await release(ledger, f"{tenant}-r", len(processes))
    outcomes = [o for result in finish(processes) for o in result["outcomes"]]
    assert outcomes.count("pending") == 5 and outcomes.count("rate_limited") == 15
