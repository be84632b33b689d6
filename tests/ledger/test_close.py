"""Idle risk-factor accounts are closed (lua/close.lua, issue 26): an agent paying 300
new payees 0.000001 USD each left 300 lasting accounts. A factor account that held
nothing since its window ended goes; one holding anything, or with an overrun or a
raise on record, stays; a late post, a compensation or a true-up of a hold naming a
closed account opens it again; and the journal still replays to every balance."""

from __future__ import annotations

import asyncio

from ledger import AccountSpec, HoldState, Ledger, audit_tenant

from .conftest import open_accounts

HOUR_MS = 3_600_000
WINDOW_MS = 300  # factor accounts' window: over within a test


async def reserve_on(
    ledger: Ledger,
    tenant: str,
    hold: str,
    payee: str,
    armed: bool = True,
    ttl_ms: int = HOUR_MS,
) -> None:
    account = f"factor:payee:{payee}"
    amounts = {"tenant:acme": 5, account: 5}
    result = await ledger.reserve(
        tenant,
        hold,
        "fp",
        amounts,
        open_missing=[
            AccountSpec(account=account, limit=1000, soft_limit=1000, window_ms=WINDOW_MS)
        ],
        ttl_ms=ttl_ms,
        armed=armed,
    )
    assert result.state in (HoldState.PENDING, HoldState.ESCALATED), result


async def factor_accounts(ledger: Ledger, tenant: str) -> set[str]:
    return {b.account for b in await ledger.balances(tenant) if b.account.startswith("factor:")}


async def close_all(ledger: Ledger, tenant: str) -> int:
    cursor, closed = await ledger.close_idle_accounts(tenant)
    while cursor:
        cursor, more = await ledger.close_idle_accounts(tenant, cursor)
        closed += more
    return closed


async def closed_once_idle(ledger: Ledger, tenant: str, expected: set[str]) -> None:
    """Close until the accounts expected to go are gone (their window must end first)."""
    deadline = asyncio.get_running_loop().time() + 10
    while expected & await factor_accounts(ledger, tenant):
        assert asyncio.get_running_loop().time() < deadline, "never closed"
        await close_all(ledger, tenant)


async def audited(ledger: Ledger, tenant: str) -> None:
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


async def test_idle_factor_accounts_close_after_their_window(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    for i in range(30):
        await reserve_on(ledger, tenant, f"h{i}", f"p{i}")
        await ledger.post(tenant, f"h{i}", 5)
    await reserve_on(ledger, tenant, "live", "kept")  # pending: holds its account
    # Idle, but still in the (hour-long) window it was used in: it stays.
    hour = AccountSpec(account="factor:payee:hour", limit=1000, soft_limit=1000, window_ms=HOUR_MS)
    await ledger.reserve(
        tenant, "v", "fp", {"factor:payee:hour": 5}, ttl_ms=HOUR_MS, open_missing=[hour]
    )
    await ledger.void(tenant, "v")
    assert len(await factor_accounts(ledger, tenant)) == 32
    await closed_once_idle(ledger, tenant, {f"factor:payee:p{i}" for i in range(30)})
    assert await factor_accounts(ledger, tenant) == {"factor:payee:kept", "factor:payee:hour"}
    tenant_account = await ledger.balance(tenant, "tenant:acme")
    assert tenant_account is not None  # policy accounts are never closed
    await audited(ledger, tenant)


async def test_an_overrun_keeps_its_account(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    await reserve_on(ledger, tenant, "o", "over")
    await ledger.post(tenant, "o", 7)  # above its 5: an overrun, on record
    await reserve_on(ledger, tenant, "q", "quiet")
    await ledger.post(tenant, "q", 5)
    await closed_once_idle(ledger, tenant, {"factor:payee:quiet"})
    assert await factor_accounts(ledger, tenant) == {"factor:payee:over"}
    await audited(ledger, tenant)


async def test_a_hold_naming_a_closed_account_settles_on_it_again(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    await reserve_on(ledger, tenant, "late", "l", armed=False, ttl_ms=0)
    await ledger.expire(tenant, "late")  # never sent: expired, released
    await reserve_on(ledger, tenant, "paid", "c")
    await ledger.post(tenant, "paid", 5)
    await closed_once_idle(ledger, tenant, {"factor:payee:l", "factor:payee:c"})
    # The effect happened after all (a late post), and another is compensated.
    posted = await ledger.post(tenant, "late", 5)
    assert "late" in posted.flags
    reopened = await ledger.balance(tenant, "factor:payee:l")
    assert reopened is not None and (reopened.limit, reopened.posted) == (1000, 5)
    await ledger.compensate(tenant, "paid", 2)
    await ledger.true_up(tenant, "paid", 9)  # a realised loss above what it posted
    compensated = await ledger.balance(tenant, "factor:payee:c")
    assert compensated is not None and compensated.overruns == 1
    await audited(ledger, tenant)


async def test_only_factor_accounts_are_asked_about(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9, principal_ops=10**9)
    assert await close_all(ledger, tenant) == 0
    assert {b.account for b in await ledger.balances(tenant)} == {
        "tenant:acme",
        "principal:ops",
    }


async def test_an_agent_opens_at_most_its_new_accounts_a_window(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    await ledger.upsert_account(
        tenant,
        AccountSpec(
            account="agent:a1", limit=10**9, soft_limit=10**9, window_ms=2000, max_new_accounts=3
        ),
    )

    async def pay(hold: str, payee: str, shadow: bool = False) -> str:
        account = f"factor:payee:{payee}"
        amounts = {"agent:a1": 5, account: 5}
        if shadow:
            amounts = {f"shadow:{a}": v for a, v in amounts.items()}
        specs = [
            AccountSpec(account=a, limit=1000, soft_limit=1000, window_ms=2000) for a in amounts
        ]
        result = await ledger.reserve(
            tenant, hold, "fp", amounts, ttl_ms=HOUR_MS, open_missing=specs, shadow=shadow
        )
        return result.reason.value

    assert [await pay(f"h{i}", f"p{i}") for i in range(3)] == ["within_budget"] * 3
    assert await pay("h3", "p3") == "account_cap"
    assert await pay("h3-shadow", "p9", shadow=True) == "account_cap"  # not a budget matter
    assert await pay("h4", "p0") == "within_budget"  # an account it opened already
    assert await factor_accounts(ledger, tenant) == {
        "factor:payee:p0",
        "factor:payee:p1",
        "factor:payee:p2",
    }
    deadline = asyncio.get_running_loop().time() + 10
    while await pay(f"next-{asyncio.get_running_loop().time()}", "p3") == "account_cap":
        assert asyncio.get_running_loop().time() < deadline, "the count never renewed"
    await audited(ledger, tenant)
