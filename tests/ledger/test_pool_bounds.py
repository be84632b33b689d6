"""A calibrating route's open set stays within bounds whatever it is fed (review1's
findings F1, F3, F4 and F6): a reserve that would take the set past them is sent
back with nothing written, or kept outside the set when priced alone, the Kish number it prices with never exceeds the count, never-
sent holds do not pad it, an approval threshold compares the price alone, and the
pending a price assumed is a decimal number."""

from __future__ import annotations

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import PoolShrank
from ledger.keys import accounts_key, journal_key, reserve_keys
from ledger.records import AccountSpec, OpenPool, PoolTicket, ReserveRequest, Verdict, pool_tag

from .conftest import open_accounts
from .test_cli import irrev_ledger

HOUR_MS = 3_600_000
TAG = pool_tag("pay POST /charges")
MAX = 2**53 - 1


async def pool(ledger: Ledger, tenant: str) -> OpenPool:
    return (await ledger.open_pools(tenant)).get(TAG, OpenPool())


async def reserve(
    ledger: Ledger, tenant: str, key: str, face: int, pending: float = 1.0, amount: int = 1
) -> None:
    await ledger.reserve(
        tenant,
        key,
        "fp",
        {"tenant:acme": amount},
        ttl_ms=HOUR_MS,
        pool=PoolTicket(TAG, face, pending, amount),
    )


async def test_a_face_past_the_open_sets_bound_is_kept_outside_it_priced_alone(
    ledger: Ledger, tenant: str
) -> None:
    """F1: the face sum passing 2^63-1 made HINCRBY fail after the hold and balances
    were written. The sum is bounded at 2^53-1 and checked before the first write; a
    hold past it priced for a pool is sent back with nothing written, and priced
    alone it is kept outside the set (review3: refusing it closed the route to every
    agent while the huge hold was open)."""
    await open_accounts(ledger, tenant, tenant_acme=10**15)
    await reserve(ledger, tenant, "big0", MAX)
    before = (await pool(ledger, tenant), await ledger.balances(tenant))
    journal = await ledger.redis.xlen(journal_key(tenant))
    with pytest.raises(PoolShrank):
        await reserve(ledger, tenant, "big1", MAX, pending=2.0)
    assert await ledger.hold(tenant, "big1") is None
    assert (await pool(ledger, tenant), await ledger.balances(tenant)) == before
    assert await ledger.redis.xlen(journal_key(tenant)) == journal
    await reserve(ledger, tenant, "big1", MAX)
    assert await ledger.hold(tenant, "big1") is not None
    assert await pool(ledger, tenant) == before[0]
    await ledger.void(tenant, "big0")
    await reserve(ledger, tenant, "small", 1000)
    after = await pool(ledger, tenant)
    assert (after.count, after.face_sum) == (1, 1000)
    await ledger.void(tenant, "big1")  # kept outside: its close leaves the set alone
    assert await pool(ledger, tenant) == after
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_lost_fields_never_give_more_than_the_count(ledger: Ledger, tenant: str) -> None:
    """F3: fields that fell behind the live holds (an older irrev's script closed a
    counted hold) drove the face sum negative and the Kish number to 1e12."""
    await open_accounts(ledger, tenant, tenant_acme=10**15)
    await reserve(ledger, tenant, "big", 1_000_000_000)
    await ledger.redis.hdel(accounts_key(tenant), f"~{TAG}|n", f"~{TAG}|s", f"~{TAG}|q")
    await reserve(ledger, tenant, "a", 1000)
    await reserve(ledger, tenant, "b", 1000)
    await ledger.void(tenant, "big")
    after = await pool(ledger, tenant)
    assert after.face_sum < 0  # the drift is there; what is priced from it is bounded
    assert 1.0 <= after.effective(1000) <= after.count + 1


async def test_a_huge_face_passing_through_cannot_raise_the_kish_number(
    ledger: Ledger, tenant: str
) -> None:
    """F3: the sum of squares is a float; one huge face joining and leaving erased
    the small squares, and ten holds of 1000 priced as 121."""
    await open_accounts(ledger, tenant, tenant_acme=10**15)
    for i in range(10):
        await reserve(ledger, tenant, f"small{i}", 1000)
    await reserve(ledger, tenant, "huge", MAX - 10_000)  # the largest that fits
    await ledger.void(tenant, "huge")
    after = await pool(ledger, tenant)
    assert after.count == 10
    assert after.effective(1000) <= 11.0


async def test_the_ledger_sends_back_a_price_for_more_than_the_count(
    ledger: Ledger, tenant: str
) -> None:
    """F3 in reserve.lua: with the sum of squares lost, three open holds read as a
    Kish number of 16; a price made for 10 must still be sent back (at most 4)."""
    await open_accounts(ledger, tenant, tenant_acme=10**15)
    for i in range(3):
        await reserve(ledger, tenant, f"o{i}", 100)
    await ledger.redis.hset(accounts_key(tenant), f"~{TAG}|q", "0")
    with pytest.raises(PoolShrank):
        await reserve(ledger, tenant, "new", 100, pending=10.0)
    await reserve(ledger, tenant, "new", 100, pending=4.0)


async def test_never_sent_escalations_do_not_pad_the_open_set(ledger: Ledger, tenant: str) -> None:
    """F4: twenty escalated holds, never sent, counted as twenty open ones."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=10**9)
    )
    for i in range(20):
        await ledger.reserve(
            tenant,
            f"esc{i}",
            "fp",
            {"tenant:acme": 10},
            ttl_ms=HOUR_MS,
            escalate_above=1,
            pool=PoolTicket(TAG, 1000),
        )
    assert (await pool(ledger, tenant)).count == 0


async def test_an_approval_threshold_compares_the_price_alone(ledger: Ledger, tenant: str) -> None:
    """F4: a pooled price below the threshold, made so by holds the agent opened,
    must not turn an escalation into an admission: the threshold reads the price the
    effect has alone."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=10**9)
    )
    result = await ledger.reserve(
        tenant,
        "k",
        "fp",
        {"tenant:acme": 40},
        ttl_ms=HOUR_MS,
        escalate_above=50,
        pool=PoolTicket(TAG, 1000, 1.0, 60),
    )
    assert result.decision is Verdict.ESCALATE
    assert result.reason == "approval_threshold"
    alone = await ledger.reserve(
        tenant,
        "k2",
        "fp",
        {"tenant:acme": 40},
        ttl_ms=HOUR_MS,
        escalate_above=50,
        pool=PoolTicket(TAG, 1000, 1.0, 40),
    )
    assert alone.decision is Verdict.ADMIT


@pytest.mark.parametrize("pending", ["nan", "0x10", "inf", "-nan", " 2", "1e"])
async def test_the_pending_a_price_assumed_is_a_decimal(
    ledger: Ledger, tenant: str, pending: str
) -> None:
    """F6: Lua's tonumber reads 'nan' (which passed the check as 1) and '0x10'."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    request = ReserveRequest(
        idempotency_key="k",
        fingerprint="fp",
        amounts={"tenant:acme": 1},
        ttl_ms=HOUR_MS,
        pool=PoolTicket(TAG, 10),
    )
    args = ledger.reserve_args(request)
    args[args.index("1.0")] = pending  # the pending of the ticket above
    reply = await ledger._run("reserve", reserve_keys(tenant, "k"), args)
    assert [str(x) for x in reply[:2]] == ["bad_input", "pending"]
    assert await ledger.hold(tenant, "k") is None


async def test_a_set_out_of_step_is_rewritten_from_the_open_holds(
    ledger: Ledger, tenant: str
) -> None:
    """F2: a gateway from before the count closing a counted hold leaves a ghost in
    the set (here: the fields of a closed hold put back by hand). The repair
    rewrites every route's set from the open holds; escalated ones do not count."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=10**9)
    )
    await reserve(ledger, tenant, "a", 1000)
    await reserve(ledger, tenant, "b", 3000)
    await ledger.reserve(
        tenant,
        "esc",
        "fp",
        {"tenant:acme": 10},
        ttl_ms=HOUR_MS,
        escalate_above=1,
        pool=PoolTicket(TAG, 500),
    )
    await ledger.mark_ambiguous(tenant, "b", "timeout")
    right = await pool(ledger, tenant)
    assert right == OpenPool(2, 4000, 10_000_000.0)
    ghost = pool_tag("deploy POST /deploys")
    await ledger.redis.hset(
        accounts_key(tenant),
        mapping={f"~{TAG}|n": 3, f"~{TAG}|s": 5000, f"~{ghost}|n": 1, f"~{ghost}|s": 7},
    )
    assert (await audit_tenant(ledger, tenant)).mismatches != []
    assert await ledger.repair_pools(tenant) == {TAG: right}
    assert (await audit_tenant(ledger, tenant)).mismatches == []
    await ledger.void(tenant, "a")
    await ledger.void(tenant, "b")
    assert await ledger.repair_pools(tenant) == {}


async def test_the_audit_repairs_a_set_out_of_step_when_asked(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """`irrev ledger audit` reports a ghost in a route's set and exits 1; with
    --repair-pools the set is rewritten first and the audit passes."""
    await open_accounts(ledger, tenant, tenant_acme=10**6)
    await reserve(ledger, tenant, "a", 1000)
    await ledger.redis.hincrby(accounts_key(tenant), f"~{TAG}|n", 1)
    found = irrev_ledger(redis_url, "audit", "--tenant", tenant)
    assert found.returncode == 1 and f"route {TAG}: 2 holds open" in found.stdout
    repaired = irrev_ledger(redis_url, "audit", "--tenant", tenant, "--repair-pools")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"{tenant}: open sets rewritten, 1 routes with holds open" in repaired.stdout
    assert await pool(ledger, tenant) == OpenPool(1, 1000, 1_000_000.0)
