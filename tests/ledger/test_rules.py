"""Temporary raises (lua/rule.lua): a rule re-set on another account moves its raise."""

from __future__ import annotations

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.journal import read_journal, replay

from .conftest import open_accounts

HOUR_MS = 3_600_000


async def test_a_rule_reset_on_another_account_leaves_no_raise_behind(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, agent_a=100, agent_b=100)
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:a", 500))
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS, raise_limit=("agent:b", 500))

    on_a = await ledger.reserve(tenant, "ka", "fp", {"agent:a": 300}, ttl_ms=HOUR_MS)
    on_b = await ledger.reserve(tenant, "kb", "fp", {"agent:b": 300}, ttl_ms=HOUR_MS)
    assert (on_a.decision.value, on_b.decision.value) == ("deny", "admit")

    # Re-set without an account: the rule stays, its raise goes.
    await ledger.set_rule(tenant, "r1", "ops", "{}", HOUR_MS)
    again = await ledger.reserve(tenant, "kb2", "fp", {"agent:b": 1}, ttl_ms=HOUR_MS)
    assert again.decision.value == "deny"

    replayed = replay(await read_journal(ledger, tenant, count=10_000))
    assert {a: r.raises for a, r in replayed.accounts.items() if r.raises} == {}
    assert (await audit_tenant(ledger, tenant)).ok
