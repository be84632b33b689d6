"""What one request would cost, and why (`irrev policy price`): pure, like the gateway's
own pricing, and checked in the gateway's order (price, allow-lists, per-effect cap).

A quote is not an admission: budgets live in the ledger, so whether the accounts have
room is not known here. It says which route matched, the effect class, the pricing
model, the face value, the price, each account a hold would debit, and, when the
gateway would refuse the request before reserving, the problem's reason code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pricing.accounts import check_per_effect_cap, factor_pattern_for, hold_accounts
from pricing.catalog import PricedEffect
from pricing.credentials import AuthenticatedAgent
from pricing.errors import RequestError
from pricing.money import minor_to_major_text, money_text
from pricing.policy import BodyFormat, EffectClass
from pricing.reading import Query
from pricing.serving import TenantPolicy, check_route_scope, is_shadow, price_request
from pricing.templates import FACTOR_PREFIX


@dataclass(frozen=True, slots=True)
class Refusal:
    """The problem the gateway would answer with: HTTP status, reason code, detail."""

    status: int
    reason: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Quote:
    tool: str
    method: str
    path: str
    effect: PricedEffect | None
    # {account id: amount} a hold would debit; without an agent, the tenant's and the
    # capped factors' accounts only (the principal and agent are the agent's).
    accounts: dict[str, int] = field(default_factory=dict)
    agent_id: str | None = None
    refusal: Refusal | None = None


def agent_by_id(policy: TenantPolicy, agent_id: str) -> AuthenticatedAgent | None:
    return policy.agents_by_id.get(agent_id)


def quote_request(
    policy: TenantPolicy,
    tool: str,
    method: str,
    path: str,
    query: Query,
    body: object,
    body_format: BodyFormat | None,
    agent: AuthenticatedAgent | None = None,
) -> Quote:
    """Price `method path` of `tool` as `price_request` does (the request read as the
    gateway reads it), as `agent` if given; a refusal is part of the quote, not an error."""
    method = method.upper()
    agent_id = agent.agent_id if agent else None
    try:
        effect = price_request(policy, tool, method, path, query, body, body_format)
    except RequestError as exc:
        return Quote(
            tool=tool,
            method=method,
            path=path,
            effect=None,
            agent_id=agent_id,
            refusal=_refusal(exc),
        )
    try:
        if effect.effect_class is EffectClass.READ:
            # A read reserves nothing; the gateway still checks its allow-lists.
            if agent is not None:
                check_route_scope(policy, agent, effect)
            accounts = {}
        elif agent is None:
            accounts = _tenant_and_factor_accounts(policy, effect)
        else:
            check_route_scope(policy, agent, effect)
            check_per_effect_cap(agent, effect)
            accounts = hold_accounts(policy, agent, effect)
    except RequestError as exc:
        return Quote(
            tool=tool,
            method=method,
            path=path,
            effect=effect,
            agent_id=agent_id,
            refusal=_refusal(exc),
        )
    return Quote(
        tool=tool, method=method, path=path, effect=effect, accounts=accounts, agent_id=agent_id
    )


def _refusal(exc: RequestError) -> Refusal:
    return Refusal(exc.status, exc.reason, str(exc))


def _tenant_and_factor_accounts(policy: TenantPolicy, effect: PricedEffect) -> dict[str, int]:
    accounts = {f"tenant:{policy.tenant}": effect.price_micros}
    for factor in effect.risk_factors:
        if factor_pattern_for(policy, factor) is not None:
            accounts[FACTOR_PREFIX + factor] = effect.price_micros
    return accounts


def quote_json(policy: TenantPolicy, quote: Quote) -> dict[str, Any]:
    """The quote as a JSON object: amounts in minor units (`*_micros`) and as text in
    major units of the risk unit."""
    scale, catalog = policy.scale, policy.catalog
    out: dict[str, Any] = {
        "tenant": policy.tenant,
        "tool": quote.tool,
        "method": quote.method,
        "path": quote.path,
        "agent": quote.agent_id,
        "currency": catalog.currency,
    }
    effect = quote.effect
    if effect is not None:
        route = effect.route
        out |= {
            "route": route.route_id if route else None,
            "matched": route is not None,
            "effect_class": effect.effect_class.value,
            "model": effect.model,
            "loss_factor": route.loss_factor if route else 1.0,
            "face_value_fields": list(route.face_fields if route else catalog.unknown_face_fields),
            "face_value_micros": effect.face_value_micros,
            "face_value": minor_to_major_text(effect.face_value_micros, scale),
            "price_micros": effect.price_micros,
            "price": minor_to_major_text(effect.price_micros, scale),
            "face_value_text": money_text(effect.face_value_micros, scale, catalog.currency),
            "price_text": money_text(effect.price_micros, scale, catalog.currency),
            "mode": "shadow" if is_shadow(policy, effect) else "enforce",
            "risk_factors": list(effect.risk_factors),
            "approval_threshold_micros": effect.approval_threshold_micros,
            "needs_approval": effect.needs_approval,
            "in_process": effect.in_process,
            "accounts": dict(quote.accounts),
        }
    refusal = quote.refusal
    out["refused"] = (
        None
        if refusal is None
        else {"status": refusal.status, "reason": refusal.reason, "detail": refusal.detail}
    )
    return out


def quote_lines(policy: TenantPolicy, quote: Quote) -> list[str]:
    """The quote for people: one fact per line."""
    doc = quote_json(policy, quote)

    def money(micros: int) -> str:
        return money_text(micros, policy.scale, policy.catalog.currency)

    lines = [f"request:      {quote.method} {quote.path} of tool {quote.tool}"]
    if quote.effect is not None:
        effect = quote.effect
        matched = doc["route"] or "none: an unknown route, priced as irreversible at face value"
        lines += [f"route:        {matched}", f"effect class: {doc['effect_class']}"]
        if effect.effect_class is EffectClass.READ:
            lines.append("price:        0 (a read: nothing is reserved)")
        else:
            fields = " * ".join(doc["face_value_fields"]) or "fixed"
            lines += [
                f"pricing:      {doc['model']} (x{doc['loss_factor']:.6g} of the face value)",
                f"face value:   {money(effect.face_value_micros)} ({fields})",
                f"price:        {money(effect.price_micros)}",
            ]
        if effect.risk_factors:
            lines.append(f"risk factors: {', '.join(effect.risk_factors)}")
        if effect.approval_threshold_micros is not None:
            verdict = "this one does" if effect.needs_approval else "this one does not"
            threshold = money(effect.approval_threshold_micros)
            lines.append(f"approval:     prices above {threshold} escalate to a human ({verdict})")
        if effect.in_process:
            lines.append("in-process:   decision-only; agents ask /v1/holds, not the proxy")
        if quote.accounts:
            who = f"agent {quote.agent_id}" if quote.agent_id else "pass --agent for the rest"
            lines.append(f"accounts ({who}):")
            width = max(len(a) for a in quote.accounts)
            lines += [f"  {a:<{width}}  {money(n)}" for a, n in quote.accounts.items()]
    if quote.refusal is not None:
        refusal = quote.refusal
        lines.append(f"refused:      {refusal.status} {refusal.reason}: {refusal.detail}")
    return lines
