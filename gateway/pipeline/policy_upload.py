"""A policy change written into the fleet's store, its refusals answered as problems:
the one way an upload (routes/admin_policies.py) and a suspension
(routes/admin_agents.py) write one."""

from __future__ import annotations

from fastapi import Request

from gateway.edge.auth import AdminIdentity
from gateway.edge.problems import Problem
from gateway.pipeline.prepare import Gate
from gateway.state.policies import PolicyLoadError
from gateway.state.policy_changes import ChangeRefused, StoreVersion
from gateway.state.tenants import Uploaded
from pricing import PolicyError


async def store_upload(
    request: Request,
    admin: AdminIdentity,
    tenant: str,
    text: str,
    base: StoreVersion | None,
    origin: str,
) -> Uploaded:
    """`TenantStore.upload`, its refusals answered as problems: the one way a policy
    change is written, whoever makes it (an upload, a suspension)."""
    gate = Gate.of(request)
    try:
        return await gate.tenants.upload(gate.ledger, tenant, text, base, origin)
    except PolicyError as exc:
        raise not_applied(exc) from exc
    except PolicyLoadError as exc:
        raise load_problem(request, exc, admin, "the policy was not applied") from exc
    except ChangeRefused as exc:
        # The store's version to start again from; none when the store holds none.
        etag = {"ETag": exc.current.etag} if exc.current.number else {}
        raise Problem(
            exc.status,
            exc.reason,
            exc.detail,
            headers=etag,
            current_version=exc.current.number,
            **({"fields": exc.fields} if exc.fields else {}),
        ) from exc
    except ValueError as exc:
        raise Problem(422, "invalid_policy", str(exc)) from exc


def not_applied(exc: PolicyError) -> Problem:
    return Problem(
        422,
        "invalid_policy",
        "the policy was not applied",
        problems=[str(p) for p in exc.findings],
    )


def load_problem(
    request: Request, exc: PolicyLoadError, admin: AdminIdentity, detail: str
) -> Problem:
    """An operator sees every file's faults; a tenant's admin only its own tenant's,
    and how many others there are: another tenant's file names, faults and secret
    names are that tenant's (contract 10)."""
    own = {
        str(Gate.of(request).tenants.file_of(admin.tenant)),
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
