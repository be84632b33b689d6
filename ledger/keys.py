"""Redis key names: pure functions. Every key of a tenant carries the `{tenant}` hash
tag, so one script touches one slot and the same code runs on Redis Cluster."""

from __future__ import annotations

TENANTS_KEY = "irrev:tenants"


def tenant_prefix(tenant: str) -> str:
    """The prefix every ledger script gets as KEYS[1]; scripts append suffixes to it."""
    return f"irrev:{{{tenant}}}:"


def account_key(tenant: str, account: str) -> str:
    return f"{tenant_prefix(tenant)}acct:{account}"


def hold_key(tenant: str, hold_id: str) -> str:
    return f"{tenant_prefix(tenant)}hold:{hold_id}"


def journal_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}journal"


def checkpoint_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}checkpoint"


def observed_key(tenant: str, outcome: str) -> str:
    """Compensation outcomes ('failures' or 'successes') counted per route id."""
    return f"{tenant_prefix(tenant)}observed:{outcome}"


def trim_lock_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}trim-lock"


def deadlines_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}deadlines"


def ambiguous_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}ambiguous"


def escalated_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}escalated"
