"""The admin API's rules: auto-approvals and limit raises that end by themselves
(set, listed, ended early). Every route needs an admin token: an operator's (every
tenant) or a tenant admin's (its tenant, in the role the rule's kind takes)."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.edge.auth import Admin, gate_of, policy_of
from gateway.edge.problems import Problem
from gateway.pipeline.notes import Note
from gateway.state.events import currency, money, rfc3339
from ledger import BadInput, Rule, UnknownAccount
from pricing import TenantPolicy
from pricing.errors import AmountError
from pricing.money import major_to_minor, money_text
from pricing.policy import AdminRole, duration_ms

log = logging.getLogger("irrev.gateway")
router = APIRouter(prefix="/v1/admin", tags=["admin"])


# A rule lives at most a week: a quarter-end or an on-call weekend, and a forgotten
# one ends soon by itself. A lasting change is a policy change (a policy_admin's).
MAX_RULE_DURATION_MS = 7 * 86_400_000


def rule_role(kind: str) -> AdminRole:
    """The role that sets a rule of `kind`, and so ends one. A raise widens a budget,
    like a policy upload, and ending it early is as much a budget decision; an
    auto-approval only stands in for the approver's own decisions, within the limits.
    A kind this gateway does not know is a policy_admin's."""
    return AdminRole.APPROVER if kind == "auto_approve" else AdminRole.POLICY_ADMIN


class RuleRequest(BaseModel):
    """`auto_approve` (an approver's): escalations of `agent` (or of any agent of
    `principal`) priced at most `max_price` are approved without a person, for
    `duration`. `raise_limit` (a policy_admin's: it widens a budget): `account`'s
    limit (and soft limit) is `amount` higher, for `duration`; it ends by itself.
    Amounts in major units of the risk unit."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["auto_approve", "raise_limit"]
    agent: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")
    principal: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")
    max_price: str | int | None = None
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._:@/-]{1,128}$")
    amount: str | int | None = None
    duration: str = Field(description="how long it lives, e.g. '2h' (at most 7d)")
    reason: Note = Field(min_length=1)


def rule_view(policy: TenantPolicy, rule: Rule) -> dict[str, Any]:
    spec = json.loads(rule.spec)
    view = {"rule": rule.rule_id, **spec, "currency": currency(policy)}
    for name in ("max_price", "amount"):
        if spec.get(name) is not None:
            view.update(money(policy, name, spec[name]))
    view["until"] = rfc3339(rule.until_ms)
    return view


def _amount(value: str | int | None, name: str, scale: int) -> int:
    if value is None:
        raise Problem(422, "bad_rule", f"this kind of rule needs '{name}'")
    try:
        return major_to_minor(value, scale)
    except AmountError as exc:
        raise Problem(422, "bad_rule", f"'{name}' {exc}") from exc


def _check_rule(policy: TenantPolicy, spec: RuleRequest) -> dict[str, Any]:
    """The rule as stored (amounts in minor units); 422 bad_rule if it names what the
    policy lacks or mixes the fields of the two kinds."""
    document = policy.document
    if spec.kind == "raise_limit":
        if spec.agent or spec.principal or spec.max_price is not None or not spec.account:
            raise Problem(422, "bad_rule", "a raise_limit rule names 'account' and 'amount' only")
        amount = _amount(spec.amount, "amount", document.scale)
        return {"kind": spec.kind, "account": spec.account, "amount": amount}
    if spec.account or spec.amount is not None:
        raise Problem(422, "bad_rule", "an auto_approve rule names no 'account' or 'amount'")
    if (spec.agent is None) == (spec.principal is None):
        raise Problem(422, "bad_rule", "name exactly one of 'agent' and 'principal'")
    if spec.agent is not None and spec.agent not in document.agents:
        raise Problem(422, "bad_rule", f"the policy has no agent {spec.agent!r}")
    if spec.principal is not None and spec.principal not in document.accounts.principals:
        raise Problem(422, "bad_rule", f"the policy has no principal {spec.principal!r}")
    max_price = _amount(spec.max_price, "max_price", document.scale)
    # The rule removes the person, never a limit: it may approve no more than the
    # policy lets one effect of the agent (any agent of the principal) be.
    caps = [
        agent.per_effect_cap
        for name, agent in document.agents.items()
        if name == spec.agent or (spec.principal is not None and agent.principal == spec.principal)
    ]
    if max_price > max(caps, default=0):
        cap = money_text(max(caps, default=0), document.scale, currency(policy))
        raise Problem(
            422, "bad_rule", f"'max_price' must be at most the per_effect_cap it covers ({cap})"
        )
    return {
        "kind": spec.kind,
        "agent": spec.agent,
        "principal": spec.principal,
        "max_price": max_price,
    }


@router.post("/tenants/{tenant}/rules", status_code=201)
async def create_rule(
    request: Request, tenant: str, spec: RuleRequest, admin: Admin
) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin, rule_role(spec.kind))
    stored = {**_check_rule(policy, spec), "by": admin.name, "reason": spec.reason}
    try:
        ttl_ms = duration_ms(spec.duration)
    except ValueError as exc:
        raise Problem(422, "bad_rule", str(exc)) from exc
    if ttl_ms > MAX_RULE_DURATION_MS:
        raise Problem(422, "bad_rule", f"'duration' {spec.duration!r} must be at most 7d")
    rule_id = f"r-{secrets.token_hex(6)}"
    ledger = gate_of(request).ledger
    text = json.dumps(stored, separators=(",", ":"))
    raised = (stored["account"], stored["amount"]) if spec.kind == "raise_limit" else None
    try:
        until_ms = await ledger.set_rule(tenant, rule_id, admin.name, text, ttl_ms, raised)
    except (UnknownAccount, BadInput) as exc:
        raise Problem(422, "bad_rule", str(exc)) from exc
    log.info(
        "rule set",
        extra={
            "tenant": tenant,
            "admin": admin.name,
            "rule": rule_id,
            "kind": spec.kind,
            "until_ms": until_ms,
        },
    )
    return rule_view(policy, Rule(rule_id, text, until_ms))


@router.get("/tenants/{tenant}/rules")
async def list_rules(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    rules = await ledger.rules(tenant, await ledger.now_ms())
    return {"rules": [rule_view(policy, rule) for rule in rules]}


@router.delete("/tenants/{tenant}/rules/{rule_id}")
async def delete_rule(request: Request, tenant: str, rule_id: str, admin: Admin) -> dict[str, Any]:
    """End a live rule early; it takes the role that sets a rule of its kind. Rule ids
    are random and never reused, so the kind read here is the deleted rule's."""
    policy_of(request, tenant, admin)  # its viewers list its rules anyway
    ledger = gate_of(request).ledger
    live = {rule.rule_id: rule for rule in await ledger.rules(tenant, await ledger.now_ms())}
    found = live.get(rule_id)
    # That a rule is not live is told to whoever may end some rule.
    needed = rule_role(json.loads(found.spec).get("kind", "")) if found else AdminRole.APPROVER
    policy_of(request, tenant, admin, needed)
    try:
        deleted = await ledger.delete_rule(tenant, rule_id, admin.name)
    except BadInput:
        deleted = False
    if not deleted:
        raise Problem(404, "not_found", "no live rule by that id")
    log.info("rule deleted", extra={"tenant": tenant, "admin": admin.name, "rule": rule_id})
    return {"rule": rule_id, "status": "deleted"}
