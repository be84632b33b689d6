"""Who is calling: an agent (Bearer token -> tenant, principal, agent), an operator
(Bearer token from IRREV_ADMIN_TOKENS: every tenant, every right) or a tenant's own
admin (`admins:` in its policy, by hash: its tenant only, within its role). Tokens
are compared by hash or in constant time; a wrong or missing one is a 401 that says
which kind of token is expected."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Protocol

from fastapi import Depends, Request

from gateway.edge.problems import Problem
from gateway.settings import GatewaySettings
from pricing import AdminRole, AuthenticatedAgent, TenantPolicy


class Agents(Protocol):
    """Where a token finds its agent (gateway/state/tenants.py's TenantStore)."""

    def authenticate(self, token: str) -> tuple[TenantPolicy, AuthenticatedAgent] | None: ...


class Credentials(Agents, Protocol):
    """Where a token finds whom it names: the TenantStore, as the edge reads it."""

    @property
    def policies(self) -> Mapping[str, TenantPolicy]: ...

    def tenant_admin(self, token: str) -> tuple[str, str, AdminRole] | None: ...

    def settler(self, token: str) -> tuple[TenantPolicy, str] | None: ...


class Door(Protocol):
    """What authentication reads of the worker's Gate (gateway/pipeline/prepare.py)."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def tenants(self) -> Credentials: ...


def _door(request: Request) -> Door:
    door: Door = request.app.state.gate
    return door


def bearer(request: Request) -> str | None:
    """The caller's Bearer token; None without one (401 wherever one is needed)."""
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        # Which one is the caller? Proxies and frameworks disagree (first, last, joined).
        raise Problem(400, "bad_authorization", "send exactly one Authorization header")
    scheme, _, token = (values[0] if values else "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _unauthenticated(expected: str) -> Problem:
    return Problem(
        401,
        "unauthenticated",
        f"send 'Authorization: Bearer <{expected} token>'",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _named(request: Request, tenant: str, who: str) -> None:
    """Who the credential named, for the refusal counter and log lines of this request."""
    request.state.tenant = tenant
    request.state.agent = who


# An operator is recorded (journal, events, logs, metrics) as `operator:<name>`: a
# tenant's admin is named by a member id, which has no ':', so no tenant can name one
# of its own admins so that its decisions read as an operator's. Tenant admins keep
# their plain names, so what tenants see of their own admins does not change.
OPERATOR_PREFIX = "operator:"


def _admin_name(gate: Door, token: str) -> str | None:
    for known, name in gate.settings.admins().items():
        if hmac.compare_digest(known.encode(), token.encode()):
            return OPERATOR_PREFIX + name
    return None


async def agent_auth(request: Request) -> tuple[TenantPolicy, AuthenticatedAgent]:
    return agent_of(request, _door(request).tenants)


def agent_of(request: Request, tenants: Agents) -> tuple[TenantPolicy, AuthenticatedAgent]:
    """The agent the request's Bearer token names (401 if none), also for `/mcp`, which
    is served outside FastAPI's dependencies."""
    token = bearer(request)
    found = tenants.authenticate(token) if token else None
    if found is None:
        raise _unauthenticated("agent")
    _named(request, found[0].tenant, found[1].agent_id)
    return found


async def admin_auth(request: Request) -> str:
    token = bearer(request)
    name = _admin_name(_door(request), token) if token else None
    if name is None:
        raise _unauthenticated("admin")
    return name


@dataclass(frozen=True)
class AdminIdentity:
    """An admin: an operator (`tenant` empty) or one tenant's admin with a role."""

    name: str
    tenant: str = ""
    role: AdminRole = AdminRole.POLICY_ADMIN

    @property
    def operator(self) -> bool:
        return not self.tenant

    def sees(self, tenant: str) -> bool:
        return self.operator or self.tenant == tenant

    def require(self, tenant: str, role: AdminRole, missing: Callable[[], Problem]) -> None:
        """`missing()` (the answer for a tenant that does not exist) for another
        tenant's admin, so it learns nothing about other tenants; 403 for a role
        that is too small. Built only when refused: most requests pass."""
        if not self.sees(tenant):
            raise missing()
        if not self.role.includes(role):
            raise Problem(
                403,
                "insufficient_role",
                f"this needs the {role.value} role; {self.name!r} is {self.role.value}",
                role=self.role.value,
                needed=role.value,
            )


def policy_of(
    request: Request, tenant: str, admin: AdminIdentity, role: AdminRole = AdminRole.VIEWER
) -> TenantPolicy:
    """The policy of `tenant` if `admin` may act on it with `role` (AdminIdentity.require)."""

    def unknown() -> Problem:
        return Problem(404, "unknown_tenant", f"no policy for tenant {tenant!r}")

    admin.require(tenant, role, unknown)
    policy = _door(request).tenants.policies.get(tenant)
    if policy is None:
        raise unknown()
    return policy


async def tenant_admin_auth(request: Request) -> AdminIdentity:
    """An operator or a tenant admin; each endpoint then checks tenant and role."""
    token = bearer(request)
    if token is None:
        raise _unauthenticated("admin")
    gate = _door(request)
    name = _admin_name(gate, token)
    if name is not None:
        return AdminIdentity(name)
    found = gate.tenants.tenant_admin(token)
    if found is None:
        raise _unauthenticated("admin")
    tenant, admin_id, role = found
    _named(request, tenant, "")
    return AdminIdentity(admin_id, tenant, role)


# The admin API routes' caller: an operator or a tenant admin.
Admin = Annotated[AdminIdentity, Depends(tenant_admin_auth)]


@dataclass(frozen=True)
class Caller:
    admin: str = ""
    policy: TenantPolicy | None = None
    agent: AuthenticatedAgent | None = None

    def may_see(self, tenant: str, owner: str) -> bool:
        if self.admin:
            return True
        assert self.agent is not None
        return self.agent.tenant_id == tenant and self.agent.agent_id == owner


async def caller_auth(request: Request) -> Caller:
    """An agent (for its own holds) or an admin (for any)."""
    token = bearer(request)
    if token is None:
        raise _unauthenticated("agent or admin")
    gate = _door(request)
    name = _admin_name(gate, token)
    if name is not None:
        return Caller(admin=name)
    found = gate.tenants.authenticate(token)
    if found is None:
        raise _unauthenticated("agent or admin")
    _named(request, found[0].tenant, found[1].agent_id)
    return Caller(policy=found[0], agent=found[1])


@dataclass(frozen=True)
class Settling:
    """Who settles a hold of `policy`'s tenant: an agent (only its own holds of
    in-process routes), a tool's settler credential (`tool`: that tool's holds) or an
    admin (any hold; the tenant is named by the `tenant` query parameter)."""

    policy: TenantPolicy
    agent: AuthenticatedAgent | None = None
    tool: str = ""
    admin: str = ""

    @property
    def trusted(self) -> bool:
        return self.agent is None


async def settling_auth(request: Request, tenant: str | None = None) -> Settling:
    token = bearer(request)
    if token is None:
        raise _unauthenticated("agent, settler or admin")
    gate = _door(request)
    name = _admin_name(gate, token)
    if name is not None:
        policy = gate.tenants.policies.get(tenant or "")
        if policy is None:
            raise Problem(404, "unknown_tenant", "an admin names the hold's tenant: ?tenant=<id>")
        return Settling(policy, admin=name)
    settler = gate.tenants.settler(token)
    if settler is not None:
        _named(request, settler[0].tenant, "")
        return Settling(settler[0], tool=settler[1])
    found = gate.tenants.authenticate(token)
    if found is None:
        raise _unauthenticated("agent, settler or admin")
    _named(request, found[0].tenant, found[1].agent_id)
    return Settling(found[0], agent=found[1])
