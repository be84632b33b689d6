"""The admin API: tenants and their policies, balances, the journal, holds by state,
the escalation queue and reconciliation. Every route needs an admin token: an
operator's (every tenant) or a tenant admin's (its tenant; viewer reads, approver
also reconciles, policy_admin also uploads and reloads policies)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from ledger import BadInput, HoldState, read_journal
from pricing import PolicyError, TenantPolicy, load_policy_text
from pricing.policy import AdminRole

from .auth import AdminIdentity, gate_of, tenant_admin_auth
from .policies import PolicyLoadError
from .problems import Problem
from .reconcile import reconcile
from .responses import escalation_id, hold_view
from .wire import StoredRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"])
Admin = Annotated[AdminIdentity, Depends(tenant_admin_auth)]


def policy_of(
    request: Request, tenant: str, admin: AdminIdentity, role: AdminRole = AdminRole.VIEWER
) -> TenantPolicy:
    unknown = Problem(404, "unknown_tenant", f"no policy for tenant {tenant!r}")
    admin.require(tenant, role, unknown)
    policy = gate_of(request).tenants.policies.get(tenant)
    if policy is None:
        raise unknown
    return policy


@router.get("/tenants")
async def tenants(request: Request, admin: Admin) -> list[dict[str, Any]]:
    gate = gate_of(request)
    out = []
    visible = (item for item in gate.tenants.policies.items() if admin.sees(item[0]))
    for tenant, policy in sorted(visible):
        counts = await gate.ledger.live_counts(tenant)
        out.append(
            {
                "tenant": tenant,
                "agents": len(policy.document.agents),
                "routes": len(policy.document.routes),
                "live_holds": counts,
            }
        )
    return out


@router.get("/tenants/{tenant}/policy")
async def show_policy(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    return policy_of(request, tenant, admin).document.model_dump(mode="json", by_alias=True)


def _upstreams(policy: TenantPolicy) -> dict[str, Any]:
    return {
        name: (tool.upstream, tool.mcp, tool.model_dump(include={"credentials"}))
        for name, tool in policy.document.tools.items()
    }


@router.put("/tenants/{tenant}/policy")
async def upload_policy(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """Replace a tenant's policy with a YAML document; refused whole if invalid.
    Where a tool's requests go and which secrets they carry are the operator's: a
    tenant admin could otherwise point the tenant's credentials (or any variable or
    file the gateway can read) at a host of its own."""
    text = (await request.body()).decode("utf-8", errors="replace")
    gate = gate_of(request)
    if not admin.operator:
        current = policy_of(request, tenant, admin, AdminRole.POLICY_ADMIN)
        try:
            proposed = load_policy_text(text, f"uploaded policy of {tenant}")
        except PolicyError as exc:
            raise _not_applied(exc) from exc
        if _upstreams(proposed) != _upstreams(current):
            raise Problem(
                403,
                "operator_only",
                "only an operator may change a tool's upstream or credentials",
            )
    try:
        policy = await gate.tenants.upload(gate.ledger, tenant, text)
    except PolicyError as exc:
        raise _not_applied(exc) from exc
    except PolicyLoadError as exc:
        raise _load_problem(request, exc, admin, "the policy was not applied") from exc
    except ValueError as exc:
        raise Problem(422, "invalid_policy", str(exc)) from exc
    return {"tenant": policy.tenant, "status": "applied"}


def _not_applied(exc: PolicyError) -> Problem:
    return Problem(
        422,
        "invalid_policy",
        "the policy was not applied",
        problems=[str(p) for p in exc.problems],
    )


def _load_problem(
    request: Request, exc: PolicyLoadError, admin: AdminIdentity, detail: str
) -> Problem:
    """An operator sees every file's faults; a tenant's admin only its own tenant's,
    and how many others there are: another tenant's file names, faults and secret
    names are that tenant's (contract 10)."""
    own = {
        str(gate_of(request).tenants.file_of(admin.tenant)),
        f"credentials of tenant {admin.tenant}",
        f"uploaded policy of {admin.tenant}",
    }
    shown = [e for e in exc.errors if admin.operator or e.source in own]
    problems = [line for error in shown for line in str(error).splitlines()]
    if hidden := len(exc.errors) - len(shown):
        problems.append(
            f"{hidden} other tenants' policy files do not load; an operator must fix them"
        )
    return Problem(422, "invalid_policy", detail, problems=problems)


@router.post("/policies/reload")
async def reload_policies(request: Request, admin: Admin) -> dict[str, Any]:
    """Reload every policy file; each file that loads is applied, whatever the others
    do. An operator hears of every file that was not; a tenant admin only of its own
    tenant's (another tenant's fault is not its business, nor does it stop its own)."""
    if not admin.operator:
        policy_of(request, admin.tenant, admin, AdminRole.POLICY_ADMIN)
    gate = gate_of(request)
    report = await gate.tenants.apply(gate.ledger)
    faults = [f for f in report.faults if admin.operator or f.tenant == admin.tenant]
    if faults:
        detail = "these policy files were not applied; their tenants keep the policy they had"
        error = PolicyLoadError([fault.error for fault in faults])
        raise _load_problem(request, error, admin, detail)
    return {"tenants": [tenant for tenant in report.tenants if admin.sees(tenant)]}


@router.get("/tenants/{tenant}/balances")
async def balances(request: Request, tenant: str, admin: Admin) -> list[dict[str, Any]]:
    policy_of(request, tenant, admin)
    rows = await gate_of(request).ledger.balances(tenant)
    return [{**asdict(b), "available": b.available} for b in rows]


@router.get("/tenants/{tenant}/journal")
async def journal(
    request: Request,
    tenant: str,
    admin: Admin,
    after: Annotated[str, Query(pattern=r"^(-|[0-9]{1,20}-[0-9]{1,20})$")] = "-",
    count: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    policy_of(request, tenant, admin)
    try:
        entries = await read_journal(gate_of(request).ledger, tenant, after=after, count=count)
    except BadInput as exc:
        raise Problem(422, "bad_request", f"'{exc.field}' {exc.message}") from exc
    return {
        "entries": [e.as_dict() for e in entries],
        "next": entries[-1].entry_id if len(entries) == count else None,
    }


@router.get("/tenants/{tenant}/holds")
async def holds(
    request: Request, tenant: str, state: HoldState, admin: Admin
) -> list[dict[str, Any]]:
    policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    out = []
    for hold_id in await ledger.hold_ids(tenant, state):
        hold = await ledger.hold(tenant, hold_id)
        if hold is not None:
            out.append(hold_view(tenant, hold))
    return out


@router.get("/tenants/{tenant}/escalations")
async def escalations(request: Request, tenant: str, admin: Admin) -> list[dict[str, Any]]:
    """The approval queue, with what each effect would do."""
    policy_of(request, tenant, admin)
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
async def reconcile_tenant(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin, AdminRole.APPROVER)
    report = await reconcile(gate_of(request), policy)
    return asdict(report)
