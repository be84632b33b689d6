"""The compiled serving view of a tenant's policy: what the gateway prices requests with.

A `PolicyDocument` is what the operator wrote; `compile_policy` builds from it, once,
everything a request needs: the route catalog, the route allow-lists and the agents
indexed by token hash. The view never changes after it is built: a policy priced with
learned outcomes is a new document compiled afresh (`pricing.observed.with_observed`),
so nothing compiled can outlive the document it was compiled from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pricing.calibration import Evidence
from pricing.catalog import Catalog, PricedEffect, compile_catalog, price_in_catalog
from pricing.credentials import AuthenticatedAgent, agents_by_id, hash_token, index_agents
from pricing.policy import BodyFormat, Mode, PolicyDocument
from pricing.reading import Query
from pricing.scopes import Scopes, compile_scopes


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantPolicy:
    """One tenant's policy, compiled: the document it came from, and what each request
    reads (the tenant, the hold and escalation TTLs, the catalog, the allow-lists and
    the agent index) without touching the document."""

    document: PolicyDocument
    tenant: str
    hold_ttl_ms: int
    escalation_ttl_ms: int
    catalog: Catalog
    scopes: Scopes
    agents_by_hash: Mapping[str, AuthenticatedAgent]
    # Every agent, also those without a token in the policy (managed keys only).
    agents_by_id: Mapping[str, AuthenticatedAgent]
    # settled residual factors by route id that calibrating routes are priced from
    evidence: Mapping[str, Evidence] = field(default_factory=dict)
    # Shadow mode: the tenant's (which unknown routes follow) and the catalog routes'
    # own, by index in the document's route list.
    shadow: bool = False
    shadow_routes: frozenset[int] = frozenset()

    @property
    def scale(self) -> int:
        return self.catalog.scale


def compile_policy(
    document: PolicyDocument, evidence: Mapping[str, Evidence] | None = None
) -> TenantPolicy:
    """The serving view of a validated document (pricing.validation has checked it);
    calibrating routes priced from `evidence` (settled factors by route id)."""
    by_id = agents_by_id(document)
    return TenantPolicy(
        document=document,
        tenant=document.tenant,
        hold_ttl_ms=document.hold_ttl_ms,
        escalation_ttl_ms=document.escalation_ttl_ms,
        catalog=compile_catalog(document, evidence),
        scopes=compile_scopes(document),
        agents_by_hash=index_agents(document, by_id),
        agents_by_id=by_id,
        evidence=dict(evidence or {}),
        shadow=document.mode is Mode.SHADOW,
        shadow_routes=frozenset(
            i for i, r in enumerate(document.routes) if (r.mode or document.mode) is Mode.SHADOW
        ),
    )


def is_shadow(policy: TenantPolicy, effect: PricedEffect) -> bool:
    """Whether the effect's route runs in shadow mode (its own `mode`, else the tenant's)."""
    if effect.route is None:
        return policy.shadow
    return effect.route.index in policy.shadow_routes


def price_request(
    policy: TenantPolicy,
    tool: str,
    method: str,
    path: str,
    query: Query,
    body: object,
    body_format: BodyFormat | None = None,
) -> PricedEffect:
    """Price one request exactly as it will be forwarded (see `price_in_catalog`).

    Raises a `RequestError` subclass (each has a `reason` code) when the request
    cannot be priced.
    """
    return price_in_catalog(policy.catalog, tool, method, path, query, body, body_format)


def check_route_scope(
    policy: TenantPolicy, agent: AuthenticatedAgent, effect: PricedEffect
) -> None:
    """Raise RouteNotAllowed unless both the agent and its principal may use the route."""
    policy.scopes.check(agent, effect)


def agent_for_token_hash(policy: TenantPolicy, token_hash: str) -> AuthenticatedAgent | None:
    return policy.agents_by_hash.get(token_hash)


def agent_for_token(policy: TenantPolicy, token: str) -> AuthenticatedAgent | None:
    return agent_for_token_hash(policy, hash_token(token))
