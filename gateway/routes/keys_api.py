"""The managed keys API: a tenant's agent and admin keys, created, listed, rotated and
revoked while the gateways run (ledger/keystore.py keeps them; gateway/state/keyring.py
serves them). A token is in the answer to its creation or rotation only, never again;
a list shows a key's id and the start of its token's hash.

An operator (IRREV_ADMIN_TOKENS) manages every tenant's keys; a tenant admin only its
own tenant's, a viewer lists them, and creating, rotating or revoking a key takes at
least approver and never less than the key grants (managed_keys.managing_role): an
approver manages viewer and approver keys, only a policy_admin agent keys and
policy_admin keys."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.edge.auth import Admin, policy_of
from gateway.edge.bodies import SHOWN_TEXT, body_schema, read_model
from gateway.edge.problems import Problem
from gateway.pipeline.prepare import Gate
from gateway.state import managed_keys
from gateway.state.managed_keys import key_view
from ledger import KeyKind, KeyNotFound, KeyNotLive, KeyRecord, KeySpec, LedgerError
from pricing import AdminRole, MemberId

log = logging.getLogger("irrev.gateway")
router = APIRouter(prefix="/v1/admin/tenants/{tenant}/keys", tags=["keys"])
MAX_LIFETIME_S = 366 * 24 * 3600
# Shown in every list of keys, the console's too: no bidi override nor zero-width
# character may change what a reader sees of whose a key is.
Text = Annotated[str, Field(max_length=200, pattern=SHOWN_TEXT)]


class KeyRequest(BaseModel):
    """A new key: an agent's (`agent`) or an admin's (`admin` and `role`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["agent", "admin"]
    agent: MemberId | None = None
    admin: MemberId | None = None
    role: AdminRole | None = None
    owner: Text = Field(min_length=1, description="who the key is for or who answers for it")
    purpose: Text = ""
    expires_in_s: int | None = Field(
        default=None, ge=1, le=MAX_LIFETIME_S, description="omit for a key that never expires"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> KeyRequest:
        if self.kind == "agent" and (self.agent is None or self.admin or self.role):
            raise ValueError("an agent key names 'agent' (and neither 'admin' nor 'role')")
        if self.kind == "admin" and (self.admin is None or self.role is None or self.agent):
            raise ValueError("an admin key names 'admin' and 'role' (and not 'agent')")
        return self

    def spec(self) -> KeySpec:
        return KeySpec(
            kind=KeyKind(self.kind),
            agent=self.agent or "",
            admin=self.admin or "",
            role=self.role.value if self.role is not None else "",
            owner=self.owner,
            purpose=self.purpose,
        )


async def _record(request: Request, tenant: str, key_id: str) -> KeyRecord:
    found = await Gate.of(request).ledger.keys.records([tenant])
    for record in found.get(tenant, []):
        if record.key_id == key_id:
            return record
    raise Problem(404, "key_not_found", f"tenant {tenant!r} has no key {key_id!r}")


async def _served(request: Request, record: KeyRecord, token: str | None) -> dict[str, Any]:
    """The answer to a write: the key (and its token, this once), once this worker
    serves what was written (the others reload on the write's announcement)."""
    gate = Gate.of(request)
    try:
        await gate.tenants.keyring.reload(gate.ledger, frozenset(gate.tenants.policies))
    except LedgerError:
        # The write stands, and a new token must reach its caller: this worker serves
        # it from its next refresh, as the others do.
        log.warning("key written; this worker reloads its keys at its next refresh")
    view = key_view(record, gate.tenants.keyring.now_ms())
    return {**view, "token": token} if token is not None else view


@router.post("", status_code=201, openapi_extra=body_schema(KeyRequest))
async def create_key(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """A new key; its token is in this answer only: keep it now. The body is read once
    the admin may manage some key (approver), and the role the key needs is checked
    once it says what key it is."""
    gate = Gate.of(request)
    policy_of(request, tenant, admin, AdminRole.APPROVER)
    body = await read_model(request, KeyRequest, gate.settings)
    spec = body.spec()
    policy = policy_of(request, tenant, admin, managed_keys.managing_role(spec))
    life_ms = body.expires_in_s * 1000 if body.expires_in_s is not None else None
    try:
        record, token = await managed_keys.issue(
            gate.ledger, policy, spec, life_ms, "" if admin.operator else admin.name
        )
    except managed_keys.UnknownAgent as exc:
        raise Problem(404, "unknown_agent", str(exc), agent=exc.agent) from exc
    except managed_keys.AdminNameTaken as exc:
        raise Problem(409, "admin_name_in_policy", str(exc), admin=exc.admin) from exc
    log.info(
        "key created",
        extra={"tenant": tenant, "admin": admin.name, "key": record.key_id, "kind": spec.kind},
    )
    return await _served(request, record, token)


@router.get("")
async def list_keys(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """Every key of the tenant, revoked and expired ones too (`state`), oldest first."""
    policy_of(request, tenant, admin)
    gate = Gate.of(request)
    records = (await gate.ledger.keys.records([tenant])).get(tenant, [])
    now_ms = await gate.ledger.keys.now_ms()
    return {"keys": [key_view(record, now_ms) for record in records]}


@router.post("/{key_id}/rotate")
async def rotate_key(request: Request, tenant: str, key_id: str, admin: Admin) -> dict[str, Any]:
    """A new token for the key (in this answer only); the old one is refused by every
    gateway from its next refresh (IRREV_POLICY_CHECK_INTERVAL_S) on."""
    policy_of(request, tenant, admin)
    found = await _record(request, tenant, key_id)
    policy_of(request, tenant, admin, managed_keys.managing_role(found.spec))
    try:
        record, token = await managed_keys.rotate(Gate.of(request).ledger, tenant, key_id)
    except KeyNotFound as exc:
        raise Problem(404, "key_not_found", str(exc)) from exc
    except KeyNotLive as exc:
        if exc.state == "revoked":
            raise Problem(409, "key_revoked", str(exc)) from exc
        raise Problem(409, "key_expired", str(exc)) from exc
    log.info("key rotated", extra={"tenant": tenant, "admin": admin.name, "key": key_id})
    return await _served(request, record, token)


@router.post("/{key_id}/revoke")
async def revoke_key(request: Request, tenant: str, key_id: str, admin: Admin) -> dict[str, Any]:
    """Revoke the key for good; again is no change (the first revocation's time stays)."""
    policy_of(request, tenant, admin)
    found = await _record(request, tenant, key_id)
    policy_of(request, tenant, admin, managed_keys.managing_role(found.spec))
    try:
        record = await Gate.of(request).ledger.keys.revoke(tenant, key_id)
    except KeyNotFound as exc:
        raise Problem(404, "key_not_found", str(exc)) from exc
    log.info("key revoked", extra={"tenant": tenant, "admin": admin.name, "key": key_id})
    return await _served(request, record, None)
