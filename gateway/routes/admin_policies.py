"""The admin API's tenants and what their admins set: each tenant's policy (as served,
its stored versions, an upload, a reload of the policy files) and the rules that bend
it for a while (auto-approvals, limit raises). Every route needs an admin token: an
operator's (every tenant) or a tenant admin's (its tenant; viewer reads, approver
also sets auto-approvals, policy_admin also uploads and reloads policies and raises
limits)."""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.edge.auth import Admin, policy_of
from gateway.edge.bodies import Note, body_schema, read_body, read_model
from gateway.edge.problems import Problem
from gateway.pipeline.policy_upload import load_problem, not_applied, store_upload
from gateway.pipeline.prepare import Gate
from gateway.state.events import amount_and_text, currency
from gateway.state.policies import PolicyLoadError
from gateway.state.policy_changes import StoreVersion
from ledger import POLICY_HISTORY, BadInput, Rule, UnknownAccount
from pricing import (
    OPERATOR_FIELDS,
    OPERATOR_TOOL_FIELDS,
    AdminRole,
    AmountError,
    PolicyDocument,
    PolicyError,
    TenantPolicy,
    duration_ms,
    load_policy_text,
    major_to_minor,
    money_text,
    rfc3339,
)

log = logging.getLogger("irrev.gateway")

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.get("/tenants")
async def tenants(request: Request, admin: Admin) -> list[dict[str, Any]]:
    gate = Gate.of(request)
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


@router.get("/tenants/{tenant}/policy", response_model=None)
async def show_policy(request: Request, tenant: str, admin: Admin) -> Response:
    """The policy this host serves, as JSON, or as its YAML text with `Accept:
    application/yaml` (what to edit and send back: a change is measured against the
    text it was made from). Its ETag is its version in the fleet's policy store, its
    number and its text's digest (`"7-<digest>"`; 0: the store holds none yet), for
    the If-Match of the change made from it."""
    policy = policy_of(request, tenant, admin)
    served = Gate.of(request).tenants.served(tenant)
    version = StoreVersion(served.version, served.file.version) if served else None
    headers = {"ETag": version.etag} if version is not None else {}
    if "yaml" in request.headers.get("accept", "") and served is not None:
        return Response(served.file.text, media_type="application/yaml", headers=headers)
    return JSONResponse(policy.document.model_dump(mode="json", by_alias=True), headers=headers)


@router.get("/tenants/{tenant}/policy/history")
async def policy_history(
    request: Request,
    tenant: str,
    admin: Admin,
    limit: Annotated[int, Query(ge=1, le=POLICY_HISTORY)] = POLICY_HISTORY,
    text: bool = False,
) -> list[dict[str, Any]]:
    """The tenant's last stored versions, newest first: version, digest, when (Redis's
    clock) and by whom; their text with `text=true`."""
    policy_of(request, tenant, admin)
    records = await Gate.of(request).ledger.policies.history(tenant, limit)
    return [
        {
            "version": r.version,
            "digest": r.digest,
            "written": rfc3339(r.stamp_ms),
            "origin": r.origin,
            **({"text": r.text} if text else {}),
        }
        for r in records
    ]


# An ETag as GET .../policy gives it: the version's number and its text's digest.
_ETAG = re.compile(r"(\d{1,18})-([0-9a-f]{1,64})")


def _base_version(request: Request) -> StoreVersion | None:
    """The store version an upload was made from: its If-Match (None without one). A
    number alone (an ETag of before versions named their digest) is refused: after a
    failover that lost that version, another version has its number."""
    values = request.headers.getlist("if-match")
    if not values:
        return None
    tag = values[0].strip().removeprefix("W/").strip('"')
    if len(values) == 1 and (found := _ETAG.fullmatch(tag)):
        return StoreVersion(int(found.group(1)), found.group(2))
    if len(values) == 1 and tag.isascii() and tag.isdigit() and len(tag) <= 18:
        raise Problem(
            412,
            "if_match_without_digest",
            f"If-Match names version {int(tag)} by its number alone, which a Redis "
            "failover can give to another version; nothing was applied: GET the policy "
            'and send your change with If-Match set to its ETag (e.g. "7-3f2a9c1b0d4e")',
        )
    raise Problem(
        400,
        "bad_if_match",
        "send one If-Match header holding the ETag of the policy version your change "
        'was made from (e.g. If-Match: "7-3f2a9c1b0d4e"), as GET .../policy gives it',
    )


def operator_changes(current: PolicyDocument, proposed: PolicyDocument) -> list[str]:
    """The fields only an operator may change (pricing.policy.OPERATOR_TOOL_FIELDS and
    OPERATOR_FIELDS) that `proposed` changes, as paths (`tools.<name>.<field>`,
    `webhook`). A tool added or removed is `tools.<name>`: where its requests go and
    who settles its holds are new, or gone, as a whole."""
    changes = []
    for name in sorted(current.tools.keys() | proposed.tools.keys()):
        before, after = current.tools.get(name), proposed.tools.get(name)
        if before is None or after is None:
            changes.append(f"tools.{name}")
            continue
        changes += [
            f"tools.{name}.{field}"
            for field in OPERATOR_TOOL_FIELDS
            if getattr(before, field) != getattr(after, field)
        ]
    changes += [f for f in OPERATOR_FIELDS if getattr(current, f) != getattr(proposed, f)]
    return changes


@router.put("/tenants/{tenant}/policy")
async def upload_policy(
    request: Request, response: Response, tenant: str, admin: Admin
) -> dict[str, Any]:
    """Change a tenant's policy to a YAML document made from the store's version its
    If-Match names (docs/design.md, "Policy changes": 428 without one; from an older
    version, only what it changes is written, and 409 `policy_conflict` where that
    was changed since to something else); refused whole if invalid. A tenant admin's
    upload may change anything but the operator's fields (`operator_changes`): where
    a tool's requests go, which secrets they carry, which command a stdio MCP server
    runs on the gateway's hosts, who settles its holds and whether an ambiguous call
    may be sent again. One that writes them as they are is no change."""
    gate = Gate.of(request)
    settings = gate.settings
    raw = await read_body(request, settings.max_policy_bytes, settings.body_timeout_s)
    text = raw.decode("utf-8", errors="replace")
    if not admin.operator:
        current = policy_of(request, tenant, admin, AdminRole.POLICY_ADMIN)
        try:
            proposed = load_policy_text(text, f"uploaded policy of {tenant}")
        except PolicyError as exc:
            raise not_applied(exc) from exc
        if changed := operator_changes(current.document, proposed.document):
            raise Problem(
                403,
                "operator_only",
                f"only an operator may change {', '.join(changed)}; nothing was applied: "
                "upload the policy with these as they are in force",
                fields=changed,
            )
    base = _base_version(request)
    uploaded = await store_upload(request, admin, tenant, text, base, f"upload {admin.name}")
    response.headers["ETag"] = uploaded.version.etag
    pending = {"limits": "pending"} if uploaded.limits_pending else {}
    version = uploaded.version.number
    return {"tenant": tenant, "status": "applied", "version": version, **pending}


@router.post("/policies/reload")
async def reload_policies(request: Request, admin: Admin) -> dict[str, Any]:
    """Reload every policy file; each file that loads is applied, whatever the others
    do. An operator hears of every file that was not; a tenant admin only of its own
    tenant's (another tenant's fault is not its business, nor does it stop its own)."""
    if not admin.operator:
        policy_of(request, admin.tenant, admin, AdminRole.POLICY_ADMIN)
    gate = Gate.of(request)
    report = await gate.tenants.apply(gate.ledger)
    faults = [f for f in report.faults if admin.operator or f.tenant == admin.tenant]
    if faults:
        detail = "these policy files were not applied; their tenants keep the policy they had"
        error = PolicyLoadError([fault.error for fault in faults])
        raise load_problem(request, error, admin, detail)
    return {"tenants": [tenant for tenant in report.tenants if admin.sees(tenant)]}


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
            view.update(amount_and_text(policy, name, spec[name]))
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


@router.post("/tenants/{tenant}/rules", status_code=201, openapi_extra=body_schema(RuleRequest))
async def create_rule(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """A rule, read once the admin may set some rule (approver); the role its kind
    needs is checked once the body says which kind it is."""
    policy_of(request, tenant, admin, AdminRole.APPROVER)
    spec = await read_model(request, RuleRequest, Gate.of(request).settings)
    policy = policy_of(request, tenant, admin, rule_role(spec.kind))
    stored = {**_check_rule(policy, spec), "by": admin.name, "reason": spec.reason}
    try:
        ttl_ms = duration_ms(spec.duration)
    except ValueError as exc:
        raise Problem(422, "bad_rule", str(exc)) from exc
    if ttl_ms > MAX_RULE_DURATION_MS:
        raise Problem(422, "bad_rule", f"'duration' {spec.duration!r} must be at most 7d")
    rule_id = f"r-{secrets.token_hex(6)}"
    ledger = Gate.of(request).ledger
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
    ledger = Gate.of(request).ledger
    rules = await ledger.rules(tenant, await ledger.now_ms())
    return {"rules": [rule_view(policy, rule) for rule in rules]}


@router.delete("/tenants/{tenant}/rules/{rule_id}")
async def delete_rule(request: Request, tenant: str, rule_id: str, admin: Admin) -> dict[str, Any]:
    """End a live rule early; it takes the role that sets a rule of its kind. Rule ids
    are random and never reused, so the kind read here is the deleted rule's."""
    policy_of(request, tenant, admin)  # its viewers list its rules anyway
    ledger = Gate.of(request).ledger
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
