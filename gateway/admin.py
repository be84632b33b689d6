"""The admin API: tenants and their policies, balances, the journal, holds by state,
the escalation queue and reconciliation. Every route needs an admin token: an
operator's (every tenant) or a tenant admin's (its tenant; viewer reads, approver
also reconciles, policy_admin also uploads and reloads policies)."""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ledger import (
    POLICY_HISTORY,
    BadInput,
    Balance,
    Hold,
    HoldState,
    HoldStateConflict,
    Ledger,
    Rule,
    Status,
    UnknownAccount,
    read_journal,
)
from pricing import (
    CALL,
    OPERATOR_FIELDS,
    OPERATOR_TOOL_FIELDS,
    AdminRole,
    AmountError,
    PolicyDocument,
    PolicyError,
    TenantPolicy,
    duration_ms,
    journal_money,
    load_policy_text,
    major_to_minor,
    money_text,
)

from .admission import resolved
from .auth import AdminIdentity, gate_of, policy_of, tenant_admin_auth
from .events import (
    amount_and_text,
    currency,
    effect_fields,
    events_of,
    live_raises,
    raised_by,
    refusals_view,
    rfc3339,
    tripped,
    tripped_view,
)
from .notes import Note
from .policies import PolicyLoadError
from .policy_changes import ChangeRefused
from .problems import Problem
from .reconcile import reconcile
from .responses import escalation_id, hold_view
from .wire import StoredRequest, receipt, record_of

log = logging.getLogger("irrev.gateway")
# The events feed reads at most FEED_PAGES journal pages of FEED_PAGE entries a call.
FEED_PAGE = 500
FEED_PAGES = 20
MINUTE_MS = 60_000

router = APIRouter(prefix="/v1/admin", tags=["admin"])
Admin = Annotated[AdminIdentity, Depends(tenant_admin_auth)]


# A journal entry id, or "-" for the start, in ASCII digits (\d takes any script's).
Cursor = Annotated[str, Query(pattern=r"^(-|[0-9]{1,20}-[0-9]{1,20})$")]


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


@router.get("/tenants/{tenant}/policy", response_model=None)
async def show_policy(request: Request, tenant: str, admin: Admin) -> Response:
    """The policy this host serves, as JSON, or as its YAML text with `Accept:
    application/yaml` (what to edit and send back: a change is measured against the
    text it was made from). Its ETag is its version in the fleet's policy store, for
    the If-Match of the change made from it."""
    policy = policy_of(request, tenant, admin)
    served = gate_of(request).tenants.served(tenant)
    headers = {"ETag": f'"{served.version}"'} if served is not None else {}
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
    records = await gate_of(request).ledger.policies.history(tenant, limit)
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


def _base_version(request: Request) -> int | None:
    """The store version an upload was made from: its If-Match (None without one)."""
    values = request.headers.getlist("if-match")
    if not values:
        return None
    tag = values[0].strip().removeprefix("W/").strip('"')
    if len(values) > 1 or not tag.isascii() or not tag.isdigit() or len(tag) > 18:
        raise Problem(
            400,
            "bad_if_match",
            "send one If-Match header holding the ETag of the policy version your change "
            'was made from (e.g. If-Match: "7"), as GET .../policy gives it',
        )
    return int(tag)


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
    text = (await request.body()).decode("utf-8", errors="replace")
    gate = gate_of(request)
    if not admin.operator:
        current = policy_of(request, tenant, admin, AdminRole.POLICY_ADMIN)
        try:
            proposed = load_policy_text(text, f"uploaded policy of {tenant}")
        except PolicyError as exc:
            raise _not_applied(exc) from exc
        if changed := operator_changes(current.document, proposed.document):
            raise Problem(
                403,
                "operator_only",
                f"only an operator may change {', '.join(changed)}; nothing was applied: "
                "upload the policy with these as they are in force",
                fields=changed,
            )
    base = _base_version(request)
    origin = f"upload {admin.name}"
    try:
        uploaded = await gate.tenants.upload(gate.ledger, tenant, text, base, origin)
    except PolicyError as exc:
        raise _not_applied(exc) from exc
    except PolicyLoadError as exc:
        raise _load_problem(request, exc, admin, "the policy was not applied") from exc
    except ChangeRefused as exc:
        raise Problem(
            exc.status,
            exc.reason,
            exc.detail,
            headers={"ETag": f'"{exc.current}"'},
            current_version=exc.current,
            **({"fields": exc.fields} if exc.fields else {}),
        ) from exc
    except ValueError as exc:
        raise Problem(422, "invalid_policy", str(exc)) from exc
    response.headers["ETag"] = f'"{uploaded.version}"'
    pending = {"limits": "pending"} if uploaded.limits_pending else {}
    return {"tenant": tenant, "status": "applied", "version": uploaded.version, **pending}


def _not_applied(exc: PolicyError) -> Problem:
    return Problem(
        422,
        "invalid_policy",
        "the policy was not applied",
        problems=[str(p) for p in exc.findings],
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
    """Every account; `raised` is what live raise_limit rules add to its `limit` now
    (`effective_limit`; at most the limit itself, as reserve.lua counts them),
    `available` is what is left under the effective limit."""
    policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    rows = await ledger.balances(tenant)
    raised = await live_raises(ledger, tenant, await ledger.now_ms())
    out = []
    for b in rows:
        extra = raised_by(raised, b)
        out.append(
            {
                **asdict(b),
                "available": b.available + extra,
                "raised": extra,
                "effective_limit": b.limit + extra,
            }
        )
    return out


@router.get("/tenants/{tenant}/journal")
async def journal(
    request: Request,
    tenant: str,
    admin: Admin,
    after: Cursor = "-",
    count: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin)
    try:
        entries = await read_journal(gate_of(request).ledger, tenant, after=after, count=count)
    except BadInput as exc:
        raise Problem(422, "bad_request", f"'{exc.field}' {exc.message}") from exc
    unit = policy.document.risk_unit
    return {
        "entries": [
            journal_money(
                e.as_dict(),
                [(d.account, d.pending, d.posted) for d in e.deltas],
                unit.scale,
                unit.currency,
            )
            for e in entries
        ],
        "next": entries[-1].entry_id if len(entries) == count else None,
    }


@router.get("/tenants/{tenant}/holds")
async def holds(
    request: Request, tenant: str, state: HoldState, admin: Admin
) -> list[dict[str, Any]]:
    policy = policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    # One batch read of the holds, not a round trip each (a listing of every escalated
    # or ambiguous hold grows with what agents left waiting).
    found = await ledger.holds(tenant, await ledger.hold_ids(tenant, state))
    return [hold_view(policy, hold) for hold in found.values()]


def _route_threshold(policy: TenantPolicy, route_id: str) -> int:
    for group in policy.catalog.routes.values():
        for route in group:
            if route.route_id == route_id:
                return route.approval_threshold_micros or 0
    return policy.catalog.unknown_approval_threshold_micros or 0


def _times(hold: Hold, now_ms: int) -> dict[str, Any]:
    return {
        "created_at": rfc3339(hold.created_ms),
        "deadline_at": rfc3339(hold.deadline_ms),
        "deadline_ms": hold.deadline_ms,
        "age_s": max(0, now_ms - hold.created_ms) // 1000,
        "expires_in_s": max(0, hold.deadline_ms - now_ms) // 1000,
    }


def target_of(stored: StoredRequest) -> str:
    """The request line as a person reads it: `POST /orders?x=1`, or for an MCP call
    its server and tool as the policy's route names them, `CALL github/delete_repo`
    (its path alone, `/delete_repo`, loses which server it goes to)."""
    if stored.method == CALL:
        return f"{CALL} {stored.tool}/{stored.path.removeprefix('/')}"
    query = f"?{stored.query}" if stored.query else ""
    return f"{stored.method} {stored.path}{query}"


def forwarded(stored: StoredRequest) -> dict[str, Any]:
    """What a forward of the held effect sends besides its body, beyond the route's
    template: the request line with the concrete path and query (which account, which
    customer) and the agent's passed headers (an API version). A person approving the
    effect approves exactly these and the body: none may be left out of their view."""
    return {
        "target": target_of(stored),
        "headers": [f"{name}: {value}" for name, value in stored.headers],
    }


def queue_item(
    policy: TenantPolicy,
    hold: Hold,
    balances: dict[str, Balance],
    raised: dict[str, int],
    now_ms: int,
) -> dict[str, Any]:
    """An escalation as the person deciding it reads it: who, what, how much, which
    account's soft band or threshold it tripped and how full that account is, how
    old it is and how long is left."""
    stored = StoredRequest.loads(hold.request)
    item: dict[str, Any] = {
        "escalation": escalation_id(policy.tenant, hold.hold_id),
        "hold": hold.hold_id,
        "tool": stored.tool,
        "method": stored.method,
        "path": stored.path,
        **effect_fields(policy, stored),
        **forwarded(stored),
        "reason": hold.reason.value,
        "tripped": tripped_view(
            policy, tripped(hold, balances, _route_threshold(policy, stored.route_id), raised)
        ),
        **_times(hold, now_ms),
    }
    return item


# Where a page of the queue ended: the last item's creation time (ms) and hold id.
QueueCursor = Annotated[str, Query(pattern=r"^[0-9]{1,16}-[A-Za-z0-9._:@/-]{1,128}$")]


@router.get("/tenants/{tenant}/escalations")
async def escalations(
    request: Request,
    tenant: str,
    admin: Admin,
    after: QueueCursor | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    """The approval queue, oldest first, a page of at most `limit` after the cursor
    `after`, with what each effect would do (its request body: GET .../holds/{id});
    `next` is the cursor of the next page (null: this was the last), `total` how
    many wait. Bodies (up to IRREV_MAX_BODY_BYTES each) and unbounded pages made the
    queue an agent could fill cost the gateway and every console watching it."""
    policy = policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    order = await ledger.escalation_order(tenant)
    waiting = len(order)
    if after is not None:
        at, _, hold_after = after.partition("-")
        order = [key for key in order if key > (int(at), hold_after)]
    now_ms = await ledger.now_ms()
    balances = {b.account: b for b in await ledger.balances(tenant)}
    raised = await live_raises(ledger, tenant, now_ms)
    # The page's holds in one batch read: a round trip each made a page of 200 cost
    # 200 round trips, however quick each.
    page = await ledger.holds(tenant, [hold_id for _, hold_id in order[:limit]])
    items = [
        queue_item(policy, hold, balances, raised, now_ms)
        for hold in page.values()
        if hold.state is HoldState.ESCALATED and hold.request  # else decided meanwhile
    ]
    more = len(order) > limit
    created, last = order[limit - 1] if more else (0, "")
    return {
        "escalations": items,
        "next": f"{created}-{last}" if more else None,
        "total": waiting,
    }


@router.get("/tenants/{tenant}/holds/{hold_id}")
async def hold_by_id(request: Request, tenant: str, hold_id: str, admin: Admin) -> dict[str, Any]:
    """Any hold of the tenant, in any state, with its effect while its record is kept."""
    policy = policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    hold = await _hold_of(ledger, tenant, hold_id)
    now_ms = await ledger.now_ms()
    view = hold_view(policy, hold)
    record = record_of(hold.request, hold.outcome)
    view.update(effect_fields(policy, record))
    if isinstance(record, StoredRequest):  # what an approver reads before deciding
        view["body"] = record.body.decode("utf-8", errors="replace")
        view.update(forwarded(record))
    unit = policy.document.risk_unit
    view["amounts_text"] = {
        account: money_text(amount, unit.scale, unit.currency)
        for account, amount in hold.amounts.items()
    }
    view.update(_times(hold, now_ms))
    view.update(
        {
            "ambiguity": hold.ambiguity or None,
            "by": hold.by or None,
            "note": hold.note or None,
            "resolved_by": hold.resolved_by or None,
            "resolution_note": hold.resolution_note or None,
        }
    )
    return view


async def _hold_of(ledger: Ledger, tenant: str, hold_id: str) -> Hold:
    try:
        hold = await ledger.hold(tenant, hold_id)
    except BadInput:
        hold = None
    if hold is None:
        raise Problem(404, "not_found", "no such hold for this tenant")
    return hold


class Resolution(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    outcome: Literal["posted", "voided"]
    reason: Note = Field(min_length=1)


@router.post("/tenants/{tenant}/holds/{hold_id}/resolve")
async def resolve_hold(
    request: Request, tenant: str, hold_id: str, spec: Resolution, admin: Admin
) -> dict[str, Any]:
    """An admin settles an ambiguous hold by what they found out: `posted` (it
    happened: charged at its price) or `voided` (it did not: released). Journaled
    with the admin and their reason; the webhook's hold.resolved event follows."""
    policy_of(request, tenant, admin, AdminRole.APPROVER)
    ledger = gate_of(request).ledger
    hold = await _hold_of(ledger, tenant, hold_id)
    wanted = HoldState(spec.outcome)
    answer = {"hold": hold_id, "state": wanted.value, "by": admin.name, "reason": spec.reason}
    if hold.resolved_by == admin.name and hold.state is wanted:
        return answer  # this admin's own request again (its answer was lost): done
    # `ambiguity` stays on a hold once it was ambiguous: a hold posted or voided in
    # the ordinary way never was, and has nothing to resolve. A posted or voided one
    # without a resolver is the crash between settling and journaling below: only
    # the note is due.
    if not hold.ambiguity or hold.resolved_by or hold.state not in (HoldState.AMBIGUOUS, wanted):
        raise _not_resolvable(hold)
    record = record_of(hold.request, hold.outcome)
    outcome = receipt(record) if record else ""
    if hold.state is HoldState.AMBIGUOUS:
        try:
            if wanted is HoldState.POSTED:
                asked = record if isinstance(record, StoredRequest) else None
                price = asked.price if asked else max(hold.amounts.values())
                await ledger.post(tenant, hold_id, price, outcome=outcome)
            else:
                await ledger.void(tenant, hold_id, outcome=outcome)
        except HoldStateConflict:
            # Another resolver settled it the other way meanwhile.
            raise _not_resolvable(await _hold_of(ledger, tenant, hold_id)) from None
    # Of resolvers who settled it the same way at once, the first to journal is the
    # one who resolved it; the others are told who.
    noted = await ledger.note_resolution(tenant, hold_id, wanted, admin.name, spec.reason)
    if noted.status is Status.EXISTS and noted.by != admin.name:
        raise _not_resolvable(await _hold_of(ledger, tenant, hold_id))
    if noted.status is Status.OK:
        resolved(tenant, admin.name, f"resolved_{wanted.value}", hold_id, record, spec.reason)
    return answer


def _not_resolvable(hold: Hold) -> Problem:
    if not hold.ambiguity:
        why = f"this one is {hold.state.value} and never was ambiguous"
    else:
        why = f"this one is {hold.state.value}, resolved by {hold.resolved_by or 'another'}"
    return Problem(
        409,
        "state_conflict",
        f"only an ambiguous hold is resolved by hand; {why}",
        state=hold.state.value,
        by=hold.resolved_by or hold.by or None,
    )


@router.get("/tenants/{tenant}/refusals")
async def refusals(
    request: Request,
    tenant: str,
    admin: Admin,
    minutes: Annotated[int, Query(ge=1, le=60)] = 60,
) -> dict[str, Any]:
    """What the gateway refused the tenant's agents in the last `minutes` minutes (the
    one in progress included), on HTTP and MCP, before the ledger or by it, counted
    by every worker and host: per minute by reason, totals by reason, agent, route
    and transport, and the rows (reason, transport, agent, route) most frequent
    first. A worker adds its counts every IRREV_REFUSALS_FLUSH_S (`flush_s`)."""
    policy_of(request, tenant, admin)
    gate = gate_of(request)
    now_ms = await gate.ledger.now_ms()
    last = now_ms // MINUTE_MS
    counts = await gate.ledger.refusals.read(tenant, range(last - minutes + 1, last + 1))
    return refusals_view(counts, now_ms, gate.settings.refusals_flush_s)


@router.get("/tenants/{tenant}/events")
async def events(
    request: Request,
    tenant: str,
    admin: Admin,
    after: Cursor = "-",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The approval loop's events after the cursor `after` (a journal entry id), in
    journal order, the shapes the webhooks send. `next` is the cursor to ask with
    next time (it moves past journal entries that are no events, too)."""
    policy = policy_of(request, tenant, admin)
    ledger = gate_of(request).ledger
    found: list[dict[str, Any]] = []
    cursor = after
    for _ in range(FEED_PAGES):
        try:
            page = await read_journal(ledger, tenant, after=cursor, count=FEED_PAGE)
        except BadInput as exc:
            raise Problem(422, "bad_request", f"'{exc.field}' {exc.message}") from exc
        for entry in page:
            if len(found) == limit:
                break
            found += await events_of(ledger, policy, [entry])
            cursor = entry.entry_id
        if len(found) == limit or len(page) < FEED_PAGE:
            break
    return {"events": found, "next": cursor}


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


@router.post("/tenants/{tenant}/reconcile")
async def reconcile_tenant(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin, AdminRole.APPROVER)
    report = await reconcile(gate_of(request), policy)
    return asdict(report)
