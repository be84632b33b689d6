"""The admin API: tenants and their policies, balances, the journal, holds by state,
the escalation queue and reconciliation. Every route needs an admin token."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from ledger.errors import BadInput
from ledger.journal import read_journal
from ledger.records import HoldState
from pricing import PolicyError, TenantPolicy

from .auth import admin_auth, gate_of
from .holds_api import hold_view
from .policies import PolicyLoadError
from .problems import Problem
from .reconcile import reconcile
from .responses import escalation_id
from .wire import StoredRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(admin_auth)])


def policy_of(request: Request, tenant: str) -> TenantPolicy:
    policy = gate_of(request).tenants.policies.get(tenant)
    if policy is None:
        raise Problem(404, "unknown_tenant", f"no policy for tenant {tenant!r}")
    return policy


@router.get("/tenants")
async def tenants(request: Request) -> list[dict[str, Any]]:
    gate = gate_of(request)
    out = []
    for tenant, policy in sorted(gate.tenants.policies.items()):
        counts = await gate.ledger.live_counts(tenant)
        out.append(
            {
                "tenant": tenant,
                "agents": len(policy.agents),
                "routes": len(policy.routes),
                "live_holds": counts,
            }
        )
    return out


@router.get("/tenants/{tenant}/policy")
async def show_policy(request: Request, tenant: str) -> dict[str, Any]:
    return policy_of(request, tenant).model_dump(mode="json", by_alias=True)


@router.put("/tenants/{tenant}/policy")
async def upload_policy(request: Request, tenant: str) -> dict[str, Any]:
    """Replace a tenant's policy with a YAML document; refused whole if invalid."""
    text = (await request.body()).decode("utf-8", errors="replace")
    gate = gate_of(request)
    try:
        policy = await gate.tenants.upload(gate.ledger, tenant, text)
    except PolicyError as exc:
        raise Problem(
            422,
            "invalid_policy",
            "the policy was not applied",
            problems=[str(p) for p in exc.problems],
        ) from exc
    except (PolicyLoadError, ValueError) as exc:
        raise Problem(422, "invalid_policy", str(exc)) from exc
    return {"tenant": policy.tenant, "status": "applied"}


@router.post("/policies/reload")
async def reload_policies(request: Request) -> dict[str, Any]:
    gate = gate_of(request)
    try:
        loaded = await gate.tenants.load(gate.ledger)
    except PolicyLoadError as exc:
        raise Problem(
            422,
            "invalid_policy",
            "the policies on disk were not applied; the previous ones stay in force",
            problems=str(exc).splitlines(),
        ) from exc
    return {"tenants": loaded}


@router.get("/tenants/{tenant}/balances")
async def balances(request: Request, tenant: str) -> list[dict[str, Any]]:
    policy_of(request, tenant)
    rows = await gate_of(request).ledger.balances(tenant)
    return [{**asdict(b), "available": b.available} for b in rows]


@router.get("/tenants/{tenant}/journal")
async def journal(
    request: Request,
    tenant: str,
    after: Annotated[str, Query(pattern=r"^(-|\d{1,20}-\d{1,20})$")] = "-",
    count: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    policy_of(request, tenant)
    try:
        entries = await read_journal(
            gate_of(request).ledger.redis, tenant, after=after, count=count
        )
    except BadInput as exc:
        raise Problem(422, "bad_request", f"'{exc.field}' {exc.message}") from exc
    return {
        "entries": [e.as_dict() for e in entries],
        "next": entries[-1].entry_id if len(entries) == count else None,
    }


@router.get("/tenants/{tenant}/holds")
async def holds(request: Request, tenant: str, state: HoldState) -> list[dict[str, Any]]:
    policy_of(request, tenant)
    ledger = gate_of(request).ledger
    out = []
    for hold_id in await ledger.hold_ids(tenant, state):
        hold = await ledger.hold(tenant, hold_id)
        if hold is not None:
            out.append(hold_view(tenant, hold))
    return out


@router.get("/tenants/{tenant}/escalations")
async def escalations(request: Request, tenant: str) -> list[dict[str, Any]]:
    """The approval queue, with what each effect would do."""
    policy_of(request, tenant)
    ledger = gate_of(request).ledger
    out = []
    for hold_id in await ledger.hold_ids(tenant, HoldState.ESCALATED):
        hold = await ledger.hold(tenant, hold_id)
        if hold is None or not hold.request:
            continue
        stored = StoredRequest.loads(hold.request)
        out.append(
            {
                "escalation": escalation_id(tenant, hold_id),
                "agent": stored.agent,
                "route": stored.route_id,
                "price": stored.price,
                "reason": hold.reason.value,
                "deadline_ms": hold.deadline_ms,
                "body": stored.body.decode("utf-8", errors="replace"),
            }
        )
    return out


@router.post("/tenants/{tenant}/reconcile")
async def reconcile_tenant(request: Request, tenant: str) -> dict[str, Any]:
    report = await reconcile(gate_of(request), policy_of(request, tenant))
    return asdict(report)
