"""Who is calling: an agent (Bearer token -> tenant, principal, agent) or an admin
(Bearer token from IRREV_ADMIN_TOKENS). Tokens are compared by hash or in constant
time; a wrong or missing one is a 401 that says which kind of token is expected."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from pricing import TenantPolicy
from pricing.credentials import AuthenticatedAgent

from .admission import Gate
from .problems import Problem


def gate_of(request: Request) -> Gate:
    gate: Gate = request.app.state.gate
    return gate


def _bearer(request: Request) -> str | None:
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


def _admin_name(gate: Gate, token: str) -> str | None:
    for known, name in gate.settings.admins().items():
        if hmac.compare_digest(known.encode(), token.encode()):
            return name
    return None


async def agent_auth(request: Request) -> tuple[TenantPolicy, AuthenticatedAgent]:
    token = _bearer(request)
    found = gate_of(request).tenants.authenticate(token) if token else None
    if found is None:
        raise _unauthenticated("agent")
    return found


async def admin_auth(request: Request) -> str:
    token = _bearer(request)
    name = _admin_name(gate_of(request), token) if token else None
    if name is None:
        raise _unauthenticated("admin")
    return name


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
    token = _bearer(request)
    if token is None:
        raise _unauthenticated("agent or admin")
    gate = gate_of(request)
    name = _admin_name(gate, token)
    if name is not None:
        return Caller(admin=name)
    found = gate.tenants.authenticate(token)
    if found is None:
        raise _unauthenticated("agent or admin")
    return Caller(policy=found[0], agent=found[1])
