"""An operator stops an agent, fleet-wide, and lets it back: `agents.<id>.suspended`
set or removed as a policy change made from the store's current version, written
through the same upload path as any other (admin_policies.store_upload): versioned,
in the history under the admin's name, merged against concurrent edits, and served
by every host within one refresh (docs/operations.md, "Stop an agent"). It takes the
policy_admin role, as any policy change does; viewers list the agents."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from gateway.edge.auth import Admin, AdminIdentity, policy_of
from gateway.edge.bodies import Note, body_schema, read_model
from gateway.edge.problems import Problem
from gateway.pipeline.policy_upload import store_upload
from gateway.pipeline.prepare import Gate
from gateway.state.policy_changes import StoreVersion
from gateway.state.suspensions import UnknownAgent, agent_fields, with_suspension
from pricing import AdminRole, Suspension, SuspensionReason, rfc3339

log = logging.getLogger("irrev.gateway")

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class SuspendBody(BaseModel):
    """Why the agent is stopped: shown to the agent in every refusal, and to people."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: SuspensionReason


class ResumeBody(BaseModel):
    """Why it may act again (optional): logged, and in the policy's history origin."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Note = ""


def _unknown_agent(tenant: str, agent: str) -> Problem:
    return Problem(404, "unknown_agent", f"tenant {tenant!r} has no agent {agent!r}", agent=agent)


def _view(tenant: str, agent: str, suspension: object, **more: Any) -> dict[str, Any]:
    state = "suspended" if suspension else "active"
    return {"tenant": tenant, "agent": agent, "state": state, "suspended": suspension, **more}


async def _set_suspension(
    request: Request,
    admin: AdminIdentity,
    tenant: str,
    agent: str,
    suspension: dict[str, str] | None,
    origin: str,
) -> dict[str, Any]:
    """Write `agents.<agent>.suspended` (None: remove it) into the store's current
    version of the policy; nothing when it already is so (`changed: false`)."""
    gate = Gate.of(request)
    record = (await gate.ledger.policies.records([tenant])).get(tenant)
    if record is None:
        # Served, yet not in the store: a Redis that lost it; the next look puts it back.
        raise Problem(
            503,
            "ledger_unavailable",
            "the policy store holds no version of this tenant yet; nothing was changed: "
            "try again in a few seconds",
            headers={"Retry-After": "2"},
        )
    source = f"the policy store's version {record.version} of {tenant}"
    try:
        _, entry = agent_fields(record.text, source, agent)
    except UnknownAgent as exc:
        raise _unknown_agent(tenant, agent) from exc
    before = entry.get("suspended")
    if (before is None) == (suspension is None):
        # Said again (an answer lost, two operators at once): as it is, nothing written.
        return _view(tenant, agent, before, changed=False, version=record.version)
    changed = with_suspension(record.text, source, agent, suspension)
    base = StoreVersion(record.version, record.digest)
    uploaded = await store_upload(request, admin, tenant, changed, base, origin)
    log.info(
        "agent suspended" if suspension else "agent resumed",
        extra={"tenant": tenant, "agent": agent, "admin": admin.name, "origin": origin},
    )
    return _view(tenant, agent, suspension, changed=True, version=uploaded.version.number)


@router.post("/tenants/{tenant}/agents/{agent}/suspend", openapi_extra=body_schema(SuspendBody))
async def suspend_agent(request: Request, tenant: str, agent: str, admin: Admin) -> dict[str, Any]:
    """Refuse every call of `agent` (403 `agent_suspended`, on every transport, with
    its managed keys too) until it is resumed; its holds already admitted or
    escalated are left as they are, but an escalation is not approved while it is
    (gateway/pipeline/approve.py). 200 `changed: false` if it already was."""
    policy_of(request, tenant, admin, AdminRole.POLICY_ADMIN)
    body = await read_model(request, SuspendBody, Gate.of(request).settings)
    at = rfc3339(await Gate.of(request).ledger.now_ms())  # Redis's clock: the fleet's one
    suspension = Suspension(reason=body.reason, by=admin.name, at=at).model_dump()
    return await _set_suspension(
        request, admin, tenant, agent, suspension, f"suspend {agent} {admin.name}"
    )


@router.post(
    "/tenants/{tenant}/agents/{agent}/resume", openapi_extra=body_schema(ResumeBody, required=False)
)
async def resume_agent(request: Request, tenant: str, agent: str, admin: Admin) -> dict[str, Any]:
    """Let a suspended agent act again. 200 `changed: false` if it was active."""
    policy_of(request, tenant, admin, AdminRole.POLICY_ADMIN)
    body = await read_model(request, ResumeBody, Gate.of(request).settings, empty_ok=True)
    origin = f"resume {agent} {admin.name}" + (f": {body.reason}" if body.reason else "")
    return await _set_suspension(request, admin, tenant, agent, None, origin)


@router.get("/tenants/{tenant}/agents")
async def list_agents(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """The agents of the policy this host serves: principal, and whether suspended."""
    agents = policy_of(request, tenant, admin).document.agents
    listed = []
    for name in sorted(agents):
        suspended = agents[name].suspended
        shown = suspended.model_dump() if suspended is not None else None
        listed.append(_view(tenant, name, shown, principal=agents[name].principal))
    return {"agents": listed}
