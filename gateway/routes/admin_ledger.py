"""The admin API's view of a tenant's ledger and the decisions made on it: balances,
the journal, holds by state, the escalation queue, one hold with the effect it
carries, an ambiguous hold resolved by hand, the refusals counted, the approval
loop's events and reconciliation. Every route needs an admin token: an operator's
(every tenant) or a tenant admin's (its tenant; viewer reads, approver also resolves
and reconciles)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.edge.auth import Admin, policy_of
from gateway.edge.bodies import Note, body_schema, read_model
from gateway.edge.problems import Problem
from gateway.edge.responses import escalation_id, hold_view
from gateway.edge.wire import StoredRequest, receipt, record_of
from gateway.pipeline.approve import resolved
from gateway.pipeline.prepare import Gate
from gateway.state.events import (
    effect_fields,
    events_of,
    live_raises,
    raised_by,
    refusals_view,
    stress_view,
    tripped,
    tripped_view,
)
from gateway.state.reconcile import reconcile
from ledger import (
    BadInput,
    Balance,
    Hold,
    HoldState,
    HoldStateConflict,
    Ledger,
    Status,
    read_journal,
)
from pricing import (
    CALL,
    AdminRole,
    TenantPolicy,
    journal_money,
    money_text,
    rfc3339,
    wire_path,
)

# The events feed reads at most FEED_PAGES journal pages of FEED_PAGE entries a call.
FEED_PAGE = 500
FEED_PAGES = 20
MINUTE_MS = 60_000

router = APIRouter(prefix="/v1/admin", tags=["admin"])

# A journal entry id, or "-" for the start, in ASCII digits (\d takes any script's).
Cursor = Annotated[str, Query(pattern=r"^(-|[0-9]{1,20}-[0-9]{1,20})$")]


@router.get("/tenants/{tenant}/balances")
async def balances(request: Request, tenant: str, admin: Admin) -> list[dict[str, Any]]:
    """Every account; `raised` is what live raise_limit rules add to its `limit` now
    (`effective_limit`; at most the limit itself, as reserve.lua counts them),
    `available` is what is left under the effective limit."""
    policy_of(request, tenant, admin)
    ledger = Gate.of(request).ledger
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
        entries = await read_journal(Gate.of(request).ledger, tenant, after=after, count=count)
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
    gate = Gate.of(request)
    now_ms = await gate.ledger.now_ms()
    last = now_ms // MINUTE_MS
    counts = await gate.ledger.refusals.read(tenant, range(last - minutes + 1, last + 1))
    return refusals_view(counts, now_ms, gate.settings.refusals_flush_s)


@router.get("/tenants/{tenant}/stress")
async def stress(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    """The tenant's stress detectors, one per route with a `stress` block, as they
    stand now by Redis's clock: on or off, score and threshold, calm rate a second,
    last trip and, while on, until when (docs/policy.md, stress)."""
    policy = policy_of(request, tenant, admin)
    gate = Gate.of(request)
    states = await gate.ledger.stress_states(tenant)
    return {"detectors": stress_view(policy, states, await gate.ledger.now_ms())}


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
    ledger = Gate.of(request).ledger
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


@router.get("/tenants/{tenant}/holds")
async def holds(
    request: Request, tenant: str, state: HoldState, admin: Admin
) -> list[dict[str, Any]]:
    policy = policy_of(request, tenant, admin)
    ledger = Gate.of(request).ledger
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
    (its path alone, `/delete_repo`, loses which server it goes to).

    The path as it goes on the wire (`wire_path`), as the query already is: the
    agent writes its path parameters, and decoded, `/orders/o-7%3Fdry_run=true` read
    `/orders/o-7?dry_run=true`, a query the upstream never gets, and `%23`, `%20` or
    a no-break space read as a fragment or as words beside the path. Encoded, nothing
    in the line is other than the bytes an approval sends."""
    if stored.method == CALL:
        return f"{CALL} {stored.tool}/{stored.path.removeprefix('/')}"
    query = f"?{stored.query}" if stored.query else ""
    return f"{stored.method} {wire_path(stored.path)}{query}"


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
    ledger = Gate.of(request).ledger
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
    ledger = Gate.of(request).ledger
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


@router.post("/tenants/{tenant}/holds/{hold_id}/resolve", openapi_extra=body_schema(Resolution))
async def resolve_hold(request: Request, tenant: str, hold_id: str, admin: Admin) -> dict[str, Any]:
    """An admin settles an ambiguous hold by what they found out: `posted` (it
    happened: charged at its price) or `voided` (it did not: released). Journaled
    with the admin and their reason; the webhook's hold.resolved event follows."""
    policy_of(request, tenant, admin, AdminRole.APPROVER)
    gate = Gate.of(request)
    spec = await read_model(request, Resolution, gate.settings)  # read once they may
    ledger = gate.ledger
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


@router.post("/tenants/{tenant}/reconcile")
async def reconcile_tenant(request: Request, tenant: str, admin: Admin) -> dict[str, Any]:
    policy = policy_of(request, tenant, admin, AdminRole.APPROVER)
    report = await reconcile(Gate.of(request), policy)
    return asdict(report)
