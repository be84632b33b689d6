"""Ledger accounts a policy defines, and the accounts one hold debits.

Account ids are `kind:id`: `tenant:<tenant>`, `principal:<id>`, `agent:<id>` and
`factor:<expanded factor>` (e.g. `factor:supplier:acme-steel`). Factor accounts are
created per concrete factor on first use, from the most specific matching pattern.
A shadow-mode hold debits each one's shadow twin, `shadow:<account id>` (shadow_hold).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ledger.limits import MAX_ACCOUNTS
from pricing.catalog import PricedEffect
from pricing.credentials import AuthenticatedAgent
from pricing.errors import BadRiskFactor, PerEffectCapExceeded
from pricing.policy import (
    AccountLimits,
    Agent,
    EffectClass,
    PolicyDocument,
    PrincipalLimits,
    RateLimits,
)
from pricing.serving import TenantPolicy
from pricing.templates import FACTOR_PREFIX

MAX_HOLD_ACCOUNTS = MAX_ACCOUNTS
# A shadow-mode hold's accounts: `shadow:<account id>` (shadow_hold).
SHADOW_PREFIX = "shadow:"

_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyAccount:
    """One account as the tenant's policy defines it: its limit, window and soft band
    as a fraction, in minor units (gateway/policies.py ledger_account makes it the
    ledger's AccountSpec)."""

    account_id: str
    limit_micros: int
    window_ms: int
    soft_band: float
    approval_threshold_micros: int | None
    max_escalations: int = 0  # an agent's: how many of its holds may wait for a human
    max_new_accounts: int = 0  # an agent's: risk-factor accounts its holds open per window
    rates: RateLimits | None = None  # an agent's or a principal's request rates

    @property
    def soft_limit_micros(self) -> int:
        """Balance above which a hold escalates; rounded down, so it escalates early."""
        num, den = self.soft_band.as_integer_ratio()
        return (self.limit_micros * num) // den


def _account(policy: PolicyDocument, account_id: str, limits: AccountLimits) -> PolicyAccount:
    return PolicyAccount(
        account_id=account_id,
        limit_micros=limits.limit,
        window_ms=policy.window_ms,
        soft_band=limits.soft_band if limits.soft_band is not None else policy.soft_band,
        approval_threshold_micros=limits.approval_threshold,
        rates=limits.rate_limits if isinstance(limits, PrincipalLimits) else None,
    )


def _agent_account(policy: PolicyDocument, account_id: str, agent: Agent) -> PolicyAccount:
    return PolicyAccount(
        account_id=account_id,
        limit_micros=agent.window_cap,
        window_ms=policy.window_ms,
        soft_band=agent.soft_band if agent.soft_band is not None else policy.soft_band,
        approval_threshold_micros=agent.approval_threshold,
        max_escalations=agent.max_escalations or policy.max_escalations,
        max_new_accounts=agent.max_new_accounts or policy.max_new_accounts,
        rates=agent.rate_limits,
    )


def factor_pattern_for(policy: TenantPolicy, factor: str) -> str | None:
    """The pattern that governs `factor`: an exact entry, else the longest `prefix*`."""
    patterns = policy.document.accounts.risk_factors
    if factor in patterns:
        return factor
    best: str | None = None
    for pattern in patterns:
        wildcard_matches = pattern.endswith("*") and factor.startswith(pattern[:-1])
        if wildcard_matches and (best is None or len(pattern) > len(best)):
            best = pattern
    return best


def factor_account(policy: TenantPolicy, factor: str) -> PolicyAccount | None:
    """Parameters of the account `factor:<factor>`, or None if no pattern caps it."""
    pattern = factor_pattern_for(policy, factor)
    if pattern is None:
        return None
    document = policy.document
    return _account(document, FACTOR_PREFIX + factor, document.accounts.risk_factors[pattern])


def policy_accounts(policy: TenantPolicy) -> list[PolicyAccount]:
    """Every account the policy names (factor wildcards excluded: see `factor_account`)."""
    doc = policy.document
    out = [_account(doc, f"tenant:{doc.tenant}", doc.accounts.tenant)]
    out += [_account(doc, f"principal:{p}", lim) for p, lim in doc.accounts.principals.items()]
    out += [
        _agent_account(doc, f"agent:{agent_id}", agent) for agent_id, agent in doc.agents.items()
    ]
    for pattern in doc.accounts.risk_factors:
        if not pattern.endswith("*"):
            out.append(_account(doc, FACTOR_PREFIX + pattern, doc.accounts.risk_factors[pattern]))
    return out


def policy_account(policy: TenantPolicy, account_id: str) -> PolicyAccount | None:
    """The parameters of one account a hold may touch, by its id; None if the policy
    has no such account (a factor no pattern caps, an agent since removed)."""
    doc = policy.document
    kind, _, name = account_id.partition(":")
    if kind == "tenant" and name == doc.tenant:
        return _account(doc, account_id, doc.accounts.tenant)
    if kind == "principal" and name in doc.accounts.principals:
        return _account(doc, account_id, doc.accounts.principals[name])
    if kind == "agent" and name in doc.agents:
        return _agent_account(doc, account_id, doc.agents[name])
    if account_id.startswith(FACTOR_PREFIX):
        return factor_account(policy, account_id.removeprefix(FACTOR_PREFIX))
    return None


def shadow_hold(
    policy: TenantPolicy, amounts: dict[str, int]
) -> tuple[dict[str, int], list[PolicyAccount]]:
    """A shadow-mode hold's accounts: each of `amounts`' own shadow account (`shadow:`
    before its id), with its limits, so that the would-be decision is made, and its
    exposure kept, on balances that enforced effects never read (docs/policy.md,
    "Shadow mode"). Returns the amounts by shadow account and their specs, for the
    reserve to open those Redis lacks."""
    shadowed: dict[str, int] = {}
    specs: list[PolicyAccount] = []
    for account_id, amount in amounts.items():
        shadow_id = SHADOW_PREFIX + account_id
        shadowed[shadow_id] = amount
        spec = policy_account(policy, account_id)
        if spec is not None:
            specs.append(replace(spec, account_id=shadow_id))
    return shadowed, specs


def check_per_effect_cap(agent: AuthenticatedAgent, effect: PricedEffect) -> None:
    """The agent's local per-effect cap applies to the face value (exposure), not the price."""
    if effect.effect_class is EffectClass.READ:
        return
    if effect.face_value_micros > agent.per_effect_cap_micros:
        raise PerEffectCapExceeded(
            agent.agent_id, effect.face_value_micros, agent.per_effect_cap_micros
        )


def check_factor_id(policy: TenantPolicy, pattern: str, factor: str) -> None:
    """BadRiskFactor if `pattern` takes integer ids and `factor`'s id is not one:
    parseInt, a PHP cast or a MySQL comparison read '42abc' as customer 42, whose cap
    an account of its own would let it dodge."""
    limits = policy.document.accounts.risk_factors[pattern]
    if limits.ids != "integer" or not pattern.endswith("*"):
        return
    given = factor[len(pattern) - 1 :]
    if not _INTEGER.fullmatch(given):
        raise BadRiskFactor(
            pattern,
            f"{given!r} is not an integer, and {pattern} takes integer ids only (ids: "
            "integer): send the id as the number it is",
        )


def hold_accounts(
    policy: TenantPolicy, agent: AuthenticatedAgent, effect: PricedEffect
) -> dict[str, int]:
    """{account_id: amount} a hold debits: tenant, principal, agent, then each capped factor.

    Every account is debited the full price: each one caps the same exposure from
    its own angle. At most MAX_HOLD_ACCOUNTS accounts (validation keeps a route's
    factors to the rest).
    """
    if agent.tenant_id != policy.tenant:
        raise ValueError(f"agent of tenant {agent.tenant_id!r} used with policy {policy.tenant!r}")
    price = effect.price_micros
    accounts = {
        f"tenant:{policy.tenant}": price,
        f"principal:{agent.principal_id}": price,
        f"agent:{agent.agent_id}": price,
    }
    for factor in effect.risk_factors:
        pattern = factor_pattern_for(policy, factor)
        if pattern is not None:
            check_factor_id(policy, pattern, factor)
            accounts[FACTOR_PREFIX + factor] = price
    if len(accounts) > MAX_HOLD_ACCOUNTS:
        raise ValueError(
            f"a hold touches at most {MAX_HOLD_ACCOUNTS} accounts, not {len(accounts)}"
        )
    return accounts
