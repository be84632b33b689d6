"""Accounts a reserve opens itself (risk factors met for the first time): in the same
atomic script, journaled, and only for a hold that is kept and holds something; a
denied record is small and short-lived."""

from __future__ import annotations

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.keys import hold_key
from ledger.records import AccountSpec, HoldState, Verdict

from .conftest import open_accounts

HOUR_MS = 3_600_000
SUPPLIER = AccountSpec(account="factor:supplier:new", limit=500, soft_limit=500)
CURRENCY = AccountSpec(account="factor:currency:xyz", limit=400, soft_limit=400, window_ms=HOUR_MS)


async def reserve(ledger: Ledger, tenant: str, key: str, price: int) -> Verdict:
    accounts = ("tenant:acme", SUPPLIER.account, CURRENCY.account)
    result = await ledger.reserve(
        tenant,
        key,
        "fp",
        dict.fromkeys(accounts, price),
        ttl_ms=HOUR_MS,
        request="x" * 2000,
        open_missing=[SUPPLIER, CURRENCY],
    )
    return result.decision


async def test_an_admitted_hold_opens_every_missing_account_at_once(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    assert await reserve(ledger, tenant, "k1", 300) is Verdict.ADMIT
    for spec in (SUPPLIER, CURRENCY):
        balance = await ledger.balance(tenant, spec.account)
        assert balance is not None
        assert (balance.limit, balance.window_ms, balance.pending) == (
            spec.limit,
            spec.window_ms,
            300,
        )
    # The currency account caps at 400: opened with the first hold's numbers.
    assert await reserve(ledger, tenant, "k2", 200) is Verdict.DENY
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_denied_hold_opens_nothing_and_is_kept_short(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=100)
    assert await reserve(ledger, tenant, "k1", 300) is Verdict.DENY
    assert await ledger.balance(tenant, SUPPLIER.account) is None
    assert await ledger.balance(tenant, CURRENCY.account) is None
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None and hold.state is HoldState.DENIED and hold.request == ""
    ttl_ms = await ledger.redis.pttl(hold_key(tenant, "k1"))
    assert 0 < ttl_ms <= ledger.denied_retention_ms < ledger.retention_ms
    # A replay of the refusal within that time is the same refusal.
    assert await reserve(ledger, tenant, "k1", 300) is Verdict.DENY
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_free_hold_opens_nothing(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=100)
    assert await reserve(ledger, tenant, "k1", 0) is Verdict.ADMIT
    assert await ledger.balance(tenant, SUPPLIER.account) is None
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None and list(hold.amounts) == ["tenant:acme"]
    await ledger.post(tenant, "k1", 0)
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_free_hold_on_accounts_never_opened_settles(ledger: Ledger, tenant: str) -> None:
    """Every account missing and priced 0: the hold is kept on no account (nothing to
    hold), and it posts and voids like any other."""
    for key in ("free-post", "free-void"):
        result = await ledger.reserve(
            tenant,
            key,
            "fp",
            dict.fromkeys((SUPPLIER.account, CURRENCY.account), 0),
            ttl_ms=HOUR_MS,
            open_missing=[SUPPLIER, CURRENCY],
        )
        assert result.decision is Verdict.ADMIT
    posted = await ledger.post(tenant, "free-post", 0)
    voided = await ledger.void(tenant, "free-void")
    assert (posted.state, voided.state) == (HoldState.POSTED, HoldState.VOIDED)
    assert await ledger.balance(tenant, SUPPLIER.account) is None
    assert (await audit_tenant(ledger, tenant)).ok
