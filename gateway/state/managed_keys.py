"""Managed keys as the admin API and `irrev keys` change and show them: a new key's
token and id are made here (the token shown once, only its hash stored), an agent
key is checked against its tenant's policy, and the role that may manage a key is
decided here, for both."""

from __future__ import annotations

import os
from typing import Any

from ledger import KeyKind, KeyRecord, KeySpec, Ledger
from pricing import AdminRole, TenantPolicy, format_token, hash_token, rfc3339

TOKEN_BYTES = 32
ID_DRAWS = 3
# What a list shows of a token's hash: enough to tell keys apart, too little to test
# a guessed token against.
HASH_SHOWN = len("sha256:") + 8


class UnknownAgent(ValueError):
    """A key for an agent its tenant's policy does not have."""

    def __init__(self, tenant: str, agent: str) -> None:
        super().__init__(
            f"tenant {tenant!r} has no agent {agent!r}: add it to the policy's agents "
            "(token_sha256 may be left out) before giving it a key"
        )
        self.agent = agent


class AdminNameTaken(ValueError):
    """A managed admin key under the name of one of the policy's admins, asked for by
    someone else: its decisions would be recorded under that admin's name."""

    def __init__(self, tenant: str, admin: str) -> None:
        super().__init__(
            f"tenant {tenant!r}'s policy names admin {admin!r}: a key under that name "
            "would record its approvals and rejections as theirs; only they may take "
            "one. Name the key after the person who will hold it"
        )
        self.admin = admin


def managing_role(spec: KeySpec) -> AdminRole:
    """The role an admin needs to create, rotate or revoke a key like `spec`: at least
    approver, and never less than the key grants. An agent's key spends the tenant's
    budget like a token written into its policy, which only a policy_admin changes."""
    if spec.kind is KeyKind.AGENT:
        return AdminRole.POLICY_ADMIN
    granted = AdminRole(spec.role)
    return granted if granted.includes(AdminRole.APPROVER) else AdminRole.APPROVER


def _new_token() -> tuple[str, str]:
    """A fresh bearer token for a managed key, and its hash (the token is shown once)."""
    token = format_token(os.urandom(TOKEN_BYTES))
    return token, hash_token(token)


async def issue(
    ledger: Ledger,
    policy: TenantPolicy,
    spec: KeySpec,
    expires_in_ms: int | None,
    asked_by: str = "",
) -> tuple[KeyRecord, str]:
    """A new key of `policy`'s tenant, and its token, asked for by the admin
    `asked_by` ('' for an operator's command). UnknownAgent for an agent the policy
    lacks; AdminNameTaken for an admin key under a policy admin's name asked for by
    anyone but that admin (decisions are recorded under the key's admin name, so an
    approver could otherwise sign as the policy's CFO); ValueError for a role that is
    not one of AdminRole's."""
    if spec.kind is KeyKind.AGENT and spec.agent not in policy.agents_by_id:
        raise UnknownAgent(policy.tenant, spec.agent)
    named = spec.admin in policy.document.admins
    if spec.kind is KeyKind.ADMIN and named and spec.admin != asked_by:
        raise AdminNameTaken(policy.tenant, spec.admin)
    if spec.kind is KeyKind.ADMIN and spec.role not in set(AdminRole):
        roles = ", ".join(AdminRole)
        raise ValueError(f"role {spec.role!r} is not one of {roles}")
    for _ in range(ID_DRAWS):  # a taken id (48 random bits) is drawn again
        token, token_hash = _new_token()
        key_id = "key_" + os.urandom(6).hex()
        record = await ledger.keys.create(policy.tenant, key_id, token_hash, spec, expires_in_ms)
        if record is not None:
            return record, token
    raise RuntimeError(f"{ID_DRAWS} random key ids in a row were taken: check the random source")


async def rotate(ledger: Ledger, tenant: str, key_id: str) -> tuple[KeyRecord, str]:
    """The key with a new token, and the token: the old one is refused from the next
    refresh of every gateway on."""
    token, token_hash = _new_token()
    return await ledger.keys.rotate(tenant, key_id, token_hash), token


def key_view(record: KeyRecord, now_ms: int) -> dict[str, Any]:
    """A key as the API, the console and the CLI show it: never its token nor its whole hash."""
    spec = record.spec
    times = {
        "created": record.created_ms,
        "expires": record.expires_ms,
        "rotated": record.rotated_ms,
        "revoked": record.revoked_ms,
        "last_used": record.last_used_ms,
    }
    view: dict[str, Any] = {
        "key_id": record.key_id,
        "tenant": record.tenant,
        "kind": spec.kind.value,
        "agent": spec.agent or None,
        "admin": spec.admin or None,
        "role": spec.role or None,
        "owner": spec.owner,
        "purpose": spec.purpose,
        "token_sha256_prefix": record.token_sha256[:HASH_SHOWN],
        "state": record.state(now_ms).value,
    }
    for name, ms in times.items():
        view[f"{name}_ms"] = ms
        view[f"{name}_at"] = rfc3339(ms) if ms is not None else None
    return view
