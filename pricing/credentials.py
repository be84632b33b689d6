"""Agent credentials: tokens are stored only as `sha256:<hex>` and looked up by hash.

A token is "irrev_" + urlsafe base64 of 32 random bytes; with 256 bits of entropy a
plain SHA-256 is enough (no salt or slow hash: nothing to brute-force), and the
lookup is by the hash, so a timing side channel reveals nothing about a token.
The random bytes are the caller's (irrev/commands/policy.py uses `secrets`).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from pricing.policy import PolicyDocument
from pricing.suspension import Suspension

TOKEN_PREFIX = "irrev_"
TOKEN_BYTES = 32


@dataclass(frozen=True, slots=True)
class AuthenticatedAgent:
    """Who is acting: the tenant, the agent and the principal it acts for, and its caps."""

    tenant_id: str
    agent_id: str
    principal_id: str
    per_effect_cap_micros: int
    window_cap_micros: int
    # Carried with the agent so that every way a credential finds it (a policy's
    # token, a managed key) brings the suspension along.
    suspended: Suspension | None = None


def format_token(random_bytes: bytes) -> str:
    if len(random_bytes) < TOKEN_BYTES:
        raise ValueError(f"a token needs at least {TOKEN_BYTES} random bytes")
    return TOKEN_PREFIX + base64.urlsafe_b64encode(random_bytes).decode("ascii").rstrip("=")


def hash_token(token: str) -> str:
    """`sha256:<hex>` of a bearer token, the only form a policy stores."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def agents_by_id(policy: PolicyDocument) -> dict[str, AuthenticatedAgent]:
    """Every agent of the policy by its id, whether or not the policy names a token for
    it (one whose credentials are managed keys has none)."""
    return {
        agent_id: AuthenticatedAgent(
            tenant_id=policy.tenant,
            agent_id=agent_id,
            principal_id=agent.principal,
            per_effect_cap_micros=agent.per_effect_cap,
            window_cap_micros=agent.window_cap,
            suspended=agent.suspended,
        )
        for agent_id, agent in policy.agents.items()
    }


def index_agents(
    policy: PolicyDocument, by_id: dict[str, AuthenticatedAgent]
) -> dict[str, AuthenticatedAgent]:
    """Agents by `sha256:<hex>` of the token the policy names: how a request finds who
    it acts for."""
    return {
        agent.token_sha256: by_id[agent_id]
        for agent_id, agent in policy.agents.items()
        if agent.token_sha256 is not None
    }
