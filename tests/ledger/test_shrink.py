"""A stress margin released (lua/shrink.lua): a hold's charge lowered, never raised,
while it is live or posted at its price; untouched once the world's number is in
(trued up, compensated) or it is settled otherwise; the journal replays it."""

from __future__ import annotations

import pytest

from ledger import HoldNotFound, HoldState, HoldStateConflict, Ledger, Status
from ledger.audit import audit_tenant

from .conftest import open_accounts

HOUR_MS = 3_600_000
ACCOUNTS = ("tenant:acme", "agent:a1")


async def balances(ledger: Ledger, tenant: str) -> dict[str, tuple[int, int]]:
    found = {b.account: (b.pending, b.posted) for b in await ledger.balances(tenant)}
    return {account: found[account] for account in ACCOUNTS}


async def held(ledger: Ledger, tenant: str, hold_id: str, amount: int) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000, agent_a1=10_000)
    amounts = dict.fromkeys(ACCOUNTS, amount)
    await ledger.reserve(tenant, hold_id, "fp", amounts, ttl_ms=HOUR_MS)


async def test_a_pending_hold_is_lowered_never_raised(ledger: Ledger, tenant: str) -> None:
    await held(ledger, tenant, "h1", 1000)
    lowered = await ledger.shrink(tenant, "h1", 760)
    assert lowered.status is Status.OK and lowered.state is HoldState.PENDING
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (760, 0))
    # asked to go back up, or to where it is: nothing written
    assert (await ledger.shrink(tenant, "h1", 900)).status is Status.EXISTS
    assert (await ledger.shrink(tenant, "h1", 760)).status is Status.EXISTS
    # what it charges now is what a post or a void settles
    await ledger.void(tenant, "h1")
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (0, 0))
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_posted_hold_is_lowered_until_it_is_trued_up(ledger: Ledger, tenant: str) -> None:
    await held(ledger, tenant, "h2", 1000)
    await ledger.post(tenant, "h2", 1000)
    assert (await ledger.shrink(tenant, "h2", 760)).status is Status.OK
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (0, 760))
    # the world's number replaces the price, margin or none
    await ledger.true_up(tenant, "h2", 900)
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (0, 900))
    with pytest.raises(HoldStateConflict):
        await ledger.shrink(tenant, "h2", 500)
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (0, 900))
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


async def test_settled_and_unknown_holds_are_refused(ledger: Ledger, tenant: str) -> None:
    await held(ledger, tenant, "h3", 1000)
    await ledger.void(tenant, "h3")
    with pytest.raises(HoldStateConflict):
        await ledger.shrink(tenant, "h3", 10)
    with pytest.raises(HoldNotFound):
        await ledger.shrink(tenant, "nope", 10)
    assert await balances(ledger, tenant) == dict.fromkeys(ACCOUNTS, (0, 0))
