"""Temporary raises (lua/rule.lua): a rule re-set on another account moves its raise;
a raise is bounded (at most the account's own limit, and never past 2^53-1, where
reserve.lua's arithmetic would round)."""

from __future__ import annotations

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput
from ledger.journal import read_journal, replay
from ledger.records import AccountSpec

from .conftest import open_accounts

HOUR_MS = 3_600_000
MAX_AMOUNT = 2**53 - 1


async def test_a_rule_reset_on_another_account_leaves_no_raise_behind(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, agent_a=100, agent_b=100)
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 100))
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:b", 100))

    on_a = await ledger.reserve(tenant, "ka", "fp", {"agent:a": 150}, ttl_ms=HOUR_MS)
    on_b = await ledger.reserve(tenant, "kb", "fp", {"agent:b": 150}, ttl_ms=HOUR_MS)
    assert (on_a.decision.value, on_b.decision.value) == ("deny", "admit")

    # Re-set without an account: the rule stays, its raise goes.
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS)
    again = await ledger.reserve(tenant, "kb2", "fp", {"agent:b": 1}, ttl_ms=HOUR_MS)
    assert again.decision.value == "deny"

    replayed = replay(await read_journal(ledger, tenant, count=10_000))
    assert {a: r.raises for a, r in replayed.accounts.items() if r.raises} == {}
    assert (await audit_tenant(ledger, tenant)).ok


async def test_the_live_raises_of_an_account_sum_to_at_most_its_limit(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, agent_a=100)
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 60))
    with pytest.raises(BadInput) as refused:
        await ledger.set_rule(tenant, "r2", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 50))
    assert refused.value.field == "amount" and "at most doubles" in refused.value.message
    # A rule set again replaces its own raise: 100 in all is the bound, not 160.
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 100))
    assert [r.rule_id for r in await ledger.rules(tenant, await ledger.now_ms())] == ["r1"]
    full = await ledger.reserve(tenant, "k1", "fp", {"agent:a": 200}, ttl_ms=HOUR_MS)
    over = await ledger.reserve(tenant, "k2", "fp", {"agent:a": 1}, ttl_ms=HOUR_MS)
    assert (full.decision.value, over.reason.value) == ("admit", "budget_exceeded")
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_limit_cut_under_its_raises_cuts_what_they_add(ledger: Ledger, tenant: str) -> None:
    """An operator cuts a limit to stop a spender: a raise set under the old limit
    counts for at most the new one (it kept its whole amount: 100 on a limit of 10)."""
    await open_accounts(ledger, tenant, agent_a=100)
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 100))
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=10, soft_limit=10))
    full = await ledger.reserve(tenant, "k1", "fp", {"agent:a": 20}, ttl_ms=HOUR_MS)
    over = await ledger.reserve(tenant, "k2", "fp", {"agent:a": 1}, ttl_ms=HOUR_MS)
    assert (full.decision.value, over.reason.value) == ("admit", "budget_exceeded")
    assert over.accounts[0].limit == 20
    replayed = replay(await read_journal(ledger, tenant, count=10_000))
    assert replayed.violations == []
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_raise_never_takes_a_limit_past_2_53(ledger: Ledger, tenant: str) -> None:
    half = 2**52
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=half, soft_limit=half))
    with pytest.raises(BadInput) as refused:
        await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", half))
    assert refused.value.field == "amount" and "2^53-1" in refused.value.message
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", half - 1))
    whole = await ledger.reserve(tenant, "k1", "fp", {"agent:a": MAX_AMOUNT}, ttl_ms=HOUR_MS)
    assert whole.decision.value == "admit" and whole.accounts[0].limit == MAX_AMOUNT


async def test_a_limit_raised_under_its_raises_counts_as_at_most_2_53(
    ledger: Ledger, tenant: str
) -> None:
    """A policy may lift a limit after a raise was set (the attack: limits at 2^53-1
    and a raise on top). The reserve then sees at most 2^53-1, so no admission takes
    pending + posted past it: there doubles round, odd micros are lost and the
    ledger no longer adds up (audit mismatches, pending below zero after release)."""
    half = 2**52
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=half, soft_limit=half))
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", half - 1))
    await ledger.upsert_account(
        tenant, AccountSpec(account="agent:a", limit=MAX_AMOUNT, soft_limit=MAX_AMOUNT)
    )
    whole = await ledger.reserve(tenant, "k1", "fp", {"agent:a": MAX_AMOUNT}, ttl_ms=HOUR_MS)
    assert whole.decision.value == "admit" and whole.accounts[0].limit == MAX_AMOUNT
    for n in range(3):
        more = await ledger.reserve(tenant, f"k{n + 2}", "fp", {"agent:a": 1}, ttl_ms=HOUR_MS)
        assert more.reason.value == "budget_exceeded"
    balance = await ledger.balance(tenant, "agent:a")
    assert balance is not None and balance.pending == MAX_AMOUNT
    await ledger.void(tenant, "k1")
    balance = await ledger.balance(tenant, "agent:a")
    assert balance is not None and balance.pending == 0
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_shadow_hold_is_refused_rather_than_counted_past_2_53(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, agent_a=100)
    first = await ledger.reserve(
        tenant, "k1", "fp", {"agent:a": MAX_AMOUNT}, ttl_ms=HOUR_MS, shadow=True
    )
    assert first.state.value == "pending" and first.reason.value == "budget_exceeded"
    with pytest.raises(BadInput) as refused:
        await ledger.reserve(tenant, "k2", "fp", {"agent:a": 1}, ttl_ms=HOUR_MS, shadow=True)
    assert refused.value.field == "amount" and "2^53-1" in refused.value.message
    assert await ledger.hold(tenant, "k2") is None
    balance = await ledger.balance(tenant, "agent:a")
    assert balance is not None and balance.pending == MAX_AMOUNT
    assert (await audit_tenant(ledger, tenant)).ok
