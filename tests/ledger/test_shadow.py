"""Shadow mode in the ledger: a would-be deny or escalate is held anyway (an
overdraft the balances show), the decision is kept in the result and the journal,
and the audit still checks contract 1 for every hold that was not a shadow one."""

from __future__ import annotations

from ledger import audit_tenant, read_journal
from ledger.client import Ledger
from ledger.records import AccountSpec, HoldState, Reason, ReserveResult, Verdict

HOUR_MS = 3_600_000


async def shadow_reserve(
    ledger: Ledger, tenant: str, key: str, price: int, shadow: bool = True
) -> ReserveResult:
    amounts = {"tenant:acme": price, "agent:a": price}
    return await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS, shadow=shadow)


async def test_a_would_be_deny_is_held_and_shows_as_an_overdraft(
    ledger: Ledger, tenant: str
) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=100, soft_limit=100)
    )
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=1000, soft_limit=1000))
    first = await shadow_reserve(ledger, tenant, "k1", 80)
    assert (first.decision, first.state, first.shadowed) == (
        Verdict.ADMIT,
        HoldState.PENDING,
        False,
    )
    over = await shadow_reserve(ledger, tenant, "k2", 50)
    assert (over.decision, over.reason, over.state) == (
        Verdict.DENY,
        Reason.BUDGET_EXCEEDED,
        HoldState.PENDING,
    )
    assert over.shadowed and over.binding.account == "tenant:acme"
    assert over.remaining == -30
    # Over its limit, the account refuses everything, and shadow still holds it.
    after = await shadow_reserve(ledger, tenant, "k3", 1)
    assert (after.decision, after.reason, after.shadowed) == (
        Verdict.DENY,
        Reason.OVER_LIMIT,
        True,
    )
    await ledger.post(tenant, "k2", 50)
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None
    assert (balance.pending, balance.posted, balance.available) == (81, 50, -31)
    # An enforcing caller on the same accounts is refused: nothing is held.
    enforced = await shadow_reserve(ledger, tenant, "k4", 1, shadow=False)
    assert (enforced.decision, enforced.state) == (Verdict.DENY, HoldState.DENIED)

    journal = {e.hold_id: e for e in await read_journal(ledger, tenant) if e.op == "reserve"}
    entries = {hold_id: entry.fields for hold_id, entry in journal.items()}
    assert "shadow" not in entries["k1"]
    assert (entries["k2"]["shadow"], entries["k2"]["why"]) == ("deny", "budget_exceeded")
    # The entry keeps no state: a reserve marked `shadow` was held (pending).
    assert (entries["k3"]["shadow"], journal["k3"].state) == ("deny", "pending")
    assert "shadow" not in entries["k4"] and journal["k4"].state == "denied"
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


async def test_a_would_be_escalation_is_held_armed_not_queued(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=100, soft_limit=50)
    )
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=1000, soft_limit=1000))
    result = await shadow_reserve(ledger, tenant, "k1", 60)
    assert (result.decision, result.reason, result.state, result.shadowed) == (
        Verdict.ESCALATE,
        Reason.SOFT_BAND,
        HoldState.PENDING,
        True,
    )
    assert await ledger.hold_ids(tenant, HoldState.ESCALATED) == []
    replay = await shadow_reserve(ledger, tenant, "k1", 60)
    assert replay.replayed and not replay.shadowed and replay.state is HoldState.PENDING
