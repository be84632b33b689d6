"""Route allow-lists: `agents.<id>.routes` and `accounts.principals.<id>.routes`.

Unset, a list allows every route; set, only the routes it names (deny by default).
An agent's effect must be allowed by its own list and by its principal's, so an
operator can confine a whole principal (finance: payments only) and narrow single
agents further. Entries are `<tool> <METHOD> <path template>`, matched by the
template's shape like the catalog (parameter names do not matter), or `<tool> *`
for every route of a tool, including unknown routes a tenant prices as irreversible.
"""

from __future__ import annotations

from dataclasses import dataclass

from pricing.catalog import PricedEffect
from pricing.credentials import AuthenticatedAgent
from pricing.errors import RequestError
from pricing.policy import PolicyDocument
from pricing.templates import TemplateError, parse_route

ANY = "*"
ScopeKey = tuple[str, str, str]  # (tool, method, path shape); (tool, "*", "*") a whole tool


class RouteNotAllowed(RequestError):
    """The route is outside the agent's or its principal's allow-list."""

    reason = "route_not_allowed"
    status = 403


def parse_scope(text: str) -> ScopeKey:
    tool, sep, rest = text.strip().partition(" ")
    if not sep or not tool:
        raise TemplateError(
            f"route scope {text!r} must be '<tool> <METHOD> <path>' or '<tool> *', "
            "e.g. 'payments POST /refunds'"
        )
    if rest.strip() == ANY:
        return tool, ANY, ANY
    method, template = parse_route(rest)
    return tool, method, template.shape


@dataclass(frozen=True, slots=True)
class Scopes:
    """`agent:<id>` / `principal:<id>` -> the allowed keys; absent: unrestricted."""

    allowed: dict[str, frozenset[ScopeKey]]

    def check(self, agent: AuthenticatedAgent, effect: PricedEffect) -> None:
        """Raise RouteNotAllowed unless both the agent and its principal may use the route."""
        for member in (f"agent:{agent.agent_id}", f"principal:{agent.principal_id}"):
            if not self.allows(member, effect):
                raise RouteNotAllowed(
                    f"{member} may not use {effect.tool} {effect.method} {effect.path}: the "
                    "route is not in its routes allow-list"
                )

    def allows(self, member: str, effect: PricedEffect) -> bool:
        keys = self.allowed.get(member)
        if keys is None:
            return True
        if (effect.tool, ANY, ANY) in keys:
            return True
        route = effect.route
        return route is not None and (route.tool, route.method, route.template.shape) in keys


def compile_scopes(policy: PolicyDocument) -> Scopes:
    """Policies are validated first (pricing.validation), so every entry parses."""
    lists = {f"agent:{a}": spec.routes for a, spec in policy.agents.items()}
    lists |= {f"principal:{p}": spec.routes for p, spec in policy.accounts.principals.items()}
    return Scopes(
        {
            member: frozenset(parse_scope(text) for text in texts)
            for member, texts in lists.items()
            if texts is not None
        }
    )
