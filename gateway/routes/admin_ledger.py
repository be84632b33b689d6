"""The admin API's view of what a tenant's ledger recorded: its balances, its
journal, the refusals counted and the approval loop's events. Every route needs an
admin token: an operator's (every tenant) or a tenant admin's (its tenant)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from gateway.edge.auth import Admin, gate_of, policy_of
from gateway.edge.problems import Problem
from gateway.state.events import events_of, live_raises, raised_by, refusals_view
from ledger import BadInput, read_journal
from pricing.units import journal_money

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
