"""The approval loop's events, read from the journal: one per escalated, approved,
rejected, expired, ambiguous or hand-resolved hold and per rule set or deleted, in
journal order, each identified by its journal entry id (receivers deduplicate by
it). The admin events feed and the webhooks send the same shapes.

Also the shapes a person reads: amounts as integer minor units with a sibling
`<field>_text` ("1,234.56 USD") and `currency`, times as RFC 3339 strings; the rules
tripped, the refusals by minute and reason, and the stress detectors, for the admin
API and the console."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.edge.responses import escalation_id
from gateway.edge.wire import StoredAnswer, StoredRequest, record_of
from ledger import (
    RULE_PREFIX,
    Balance,
    Hold,
    JournalEntry,
    Ledger,
    Reason,
    RefusalCount,
    pool_tag,
)
from pricing import Cusum, CusumState, Stress, TenantPolicy, cusum_at, money_text, rfc3339

# journal op -> event type; a reserve is an event only when it escalated.
HOLD_EVENTS = {
    "approve": "hold.approved",
    "reject": "hold.rejected",
    "expire": "hold.expired",
    "ambiguous": "hold.ambiguous",
    "resolve": "hold.resolved",
}
EVENT_TYPES = (
    "hold.escalated",
    *HOLD_EVENTS.values(),
    "rule.set",
    "rule.deleted",
)


def entry_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def amount_and_text(policy: TenantPolicy, field: str, amount: int) -> dict[str, Any]:
    """`{field: amount, field_text: "1,234.5 USD"}` in the tenant's risk unit."""
    unit = policy.document.risk_unit
    return {field: amount, f"{field}_text": money_text(amount, unit.scale, unit.currency)}


def currency(policy: TenantPolicy) -> str:
    return policy.document.risk_unit.currency


def event_type(entry: JournalEntry) -> str | None:
    """The event a journal entry is, or None (balance changes, accounts, settlements)."""
    if entry.op == "reserve":
        # The reserve entry keeps no state: JournalEntry derives it from the reason.
        return "hold.escalated" if entry.state == "escalated" else None
    if entry.op == "rule":
        return "rule.deleted" if entry.fields.get("act") == "delete" else "rule.set"
    return HOLD_EVENTS.get(entry.op)


def effect_fields(
    policy: TenantPolicy, record: StoredRequest | StoredAnswer | None
) -> dict[str, Any]:
    """Who asked for the effect and what it is, from the record its hold keeps."""
    if record is None:
        return {}
    out: dict[str, Any] = {"agent": record.agent, "route": record.route_id}
    agent = policy.document.agents.get(record.agent)
    out["principal"] = agent.principal if agent else None
    out["currency"] = currency(policy)
    out.update(amount_and_text(policy, "face_value", record.face_value))
    if isinstance(record, StoredRequest):
        out.update(amount_and_text(policy, "price", record.price))
    return out


def _hold_event(
    policy: TenantPolicy, entry: JournalEntry, kind: str, hold: Hold | None
) -> dict[str, Any]:
    f = entry.fields
    hold_id = entry.hold_id
    event: dict[str, Any] = {"hold": hold_id, "state": entry.state}
    if kind == "hold.escalated":
        event["escalation"] = escalation_id(policy.tenant, hold_id)
        event["cause"] = f.get("why")
    if kind == "hold.ambiguous":
        event["cause"] = f.get("why")
    if kind in ("hold.approved", "hold.rejected", "hold.resolved"):
        by = f.get("by", "")
        event["by"] = by
        event["reason"] = f.get("note", "")
        event["automatic"] = by.startswith(RULE_PREFIX)
        if event["automatic"]:
            event["rule"] = by[len(RULE_PREFIX) :]
    if kind == "hold.resolved":
        event["outcome"] = entry.state
    if hold is not None:
        event.update(effect_fields(policy, record_of(hold.request, hold.outcome)))
        if "price" not in event and hold.amounts:
            event.update(amount_and_text(policy, "price", max(hold.amounts.values())))
    return event


def _rule_event(policy: TenantPolicy, entry: JournalEntry) -> dict[str, Any]:
    f = entry.fields
    event: dict[str, Any] = {"rule": f.get("rule"), "by": f.get("by")}
    if "until" in f:
        event["until"] = rfc3339(int(f["until"]))
    if "spec" in f:
        event["spec"] = json.loads(f["spec"])
    return event


async def events_of(
    ledger: Ledger, policy: TenantPolicy, entries: Iterable[JournalEntry]
) -> list[dict[str, Any]]:
    """The events among `entries`, in their order, each with what its hold's record
    still tells (agent, route, price) when the hold is still kept."""
    out = []
    for entry in entries:
        kind = event_type(entry)
        if kind is None:
            continue
        event: dict[str, Any] = {
            "id": entry.entry_id,
            "type": kind,
            "tenant": policy.tenant,
            "at": rfc3339(entry_ms(entry.entry_id)),
        }
        if kind.startswith("hold."):
            hold = await ledger.hold(policy.tenant, entry.hold_id) if entry.hold_id else None
            event.update(_hold_event(policy, entry, kind, hold))
        else:
            event.update(_rule_event(policy, entry))
        out.append(event)
    return out


@dataclass(frozen=True)
class Tripped:
    """The account whose soft band or approval threshold escalated a hold, its limit
    and threshold in force, what it had used before the hold and the hold's amount."""

    account: str | None
    limit: int
    used: int
    amount: int
    threshold: int


async def live_raises(ledger: Ledger, tenant: str, now_ms: int) -> dict[str, int]:
    """What the raise_limit rules live at `now_ms` (Redis's clock) add to each
    account's limit and soft limit, summed by account (reserve.lua counts at most the
    limit itself of it: `raised_by`)."""
    raised: dict[str, int] = {}
    for rule in await ledger.rules(tenant, now_ms):
        spec = json.loads(rule.spec)
        if spec.get("kind") == "raise_limit":
            raised[spec["account"]] = raised.get(spec["account"], 0) + spec["amount"]
    return raised


def raised_by(raised: Mapping[str, int], balance: Balance) -> int:
    """What live raises add to `balance`'s limit, as reserve.lua counts them."""
    return min(raised.get(balance.account, 0), balance.limit)


def tripped(
    hold: Hold, balances: dict[str, Balance], route_threshold: int, raised: Mapping[str, int]
) -> Tripped:
    """Which account escalated the hold, by reserve.lua's own rule and order and on the
    numbers it counted: the first whose pending + posted would pass its soft limit
    (soft_band), or whose approval threshold the price is above (else the route's
    threshold decided). The soft limit is the one in force when the hold was reserved:
    a raise lifts the limit and the soft limit alike, and the hold recorded the limit
    with the raises then live. The account's limit and threshold are shown as in force
    now: `raised` is what live raise_limit rules add now (`live_raises`)."""
    for account, amount in hold.amounts.items():
        balance = balances.get(account)
        if balance is None:
            continue
        used = hold.used.get(account, 0)
        raised_then = max(0, hold.limits.get(account, balance.limit) - balance.limit)
        now = raised_by(raised, balance)
        if hold.reason is Reason.SOFT_BAND and used + amount > balance.soft_limit + raised_then:
            return Tripped(account, balance.limit + now, used, amount, balance.soft_limit + now)
        threshold = balance.approval_threshold
        if hold.reason is Reason.APPROVAL_THRESHOLD and 0 < threshold < amount:
            return Tripped(account, balance.limit + now, used, amount, threshold)
    price = max(hold.amounts.values(), default=0)
    return Tripped(None, 0, 0, price, route_threshold)


def tripped_view(policy: TenantPolicy, trip: Tripped) -> dict[str, Any]:
    view: dict[str, Any] = {"account": trip.account, "currency": currency(policy)}
    view.update(amount_and_text(policy, "threshold", trip.threshold))
    if trip.account is not None:
        view.update(amount_and_text(policy, "limit", trip.limit))
        view.update(amount_and_text(policy, "used", trip.used))
        # After this hold: what approving it would make of the account.
        view["utilisation"] = (
            round((trip.used + trip.amount) / trip.limit, 4) if trip.limit else None
        )
    return view


# The refusal counts' rows an answer lists, most frequent first (the totals by reason,
# agent and route count every row).
REFUSAL_ROWS = 200


def _ranked(totals: dict[str, int], name: str) -> list[dict[str, Any]]:
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return [{name: key, "count": count} for key, count in ranked]


def refusals_view(
    counts: Mapping[int, Sequence[RefusalCount]], now_ms: int, flush_s: float
) -> dict[str, Any]:
    """Refusals as an operator reads them: each minute of `counts` (minutes since the
    epoch, oldest first, the last one in progress at `now_ms`) with its count by
    reason, the totals by reason, agent, route and transport, and the rows (reason,
    transport, agent, route) with their count and the last minute they were seen."""
    minutes = sorted(counts)
    per_minute: list[dict[str, Any]] = []
    rows: dict[tuple[str, str, str, str], tuple[int, int]] = {}
    by: dict[str, dict[str, int]] = {"reason": {}, "agent": {}, "route": {}, "transport": {}}
    for minute in minutes:
        reasons: dict[str, int] = {}
        for c in counts[minute]:
            reasons[c.reason] = reasons.get(c.reason, 0) + c.count
            for name in by:
                value = getattr(c, name)
                by[name][value] = by[name].get(value, 0) + c.count
            key = (c.reason, c.transport, c.agent, c.route)
            rows[key] = (rows.get(key, (0, 0))[0] + c.count, minute)
        per_minute.append(
            {"at": rfc3339(minute * 60_000), "count": sum(reasons.values()), "by_reason": reasons}
        )
    ranked = sorted(rows.items(), key=lambda item: (-item[1][0], -item[1][1], item[0]))
    return {
        "minutes": len(minutes),
        "since": rfc3339(minutes[0] * 60_000) if minutes else rfc3339(now_ms),
        "until": rfc3339(now_ms),
        "flush_s": flush_s,
        "total": sum(by["reason"].values()),
        "per_minute": per_minute,
        "by_reason": _ranked(by["reason"], "reason"),
        "by_agent": _ranked(by["agent"], "agent"),
        "by_route": _ranked(by["route"], "route"),
        "by_transport": _ranked(by["transport"], "transport"),
        "rows": [
            {
                "reason": reason,
                "transport": transport,
                "agent": agent,
                "route": route,
                "count": count,
                "last_at": rfc3339(last * 60_000),
            }
            for (reason, transport, agent, route), (count, last) in ranked[:REFUSAL_ROWS]
        ],
        "rows_total": len(ranked),
    }


def stressed_routes(policy: TenantPolicy) -> list[tuple[str, Stress]]:
    """The routes of the tenant's catalog that have a detector, by route id."""
    found = {
        route.route_id: route.stress
        for routes in policy.catalog.routes.values()
        for route in routes
        if route.stress is not None
    }
    return sorted(found.items())


def stress_view(
    policy: TenantPolicy, states: dict[str, dict[str, float]], now_ms: int
) -> list[dict[str, Any]]:
    """The tenant's stress detectors as an operator sees them, read from the ledger
    and stood at Redis's clock now (pricing's `cusum_at`). Each: on or off now, its
    score against its threshold, its calm rate a second, when it last tripped and,
    while on, until when. A detector that has seen no request since its settings
    were set (or a week) is off at its warm-up."""
    out = []
    for route_id, stress in stressed_routes(policy):
        cusum = Cusum(stress.shift, stress.threshold, stress.hold_ticks)
        tick_ms = stress.tick_ms
        now = float(now_ms // tick_ms)
        stored = states.get(pool_tag(route_id), {})
        if stored.get("ms") == tick_ms:
            state = CusumState.stored(stored)
        else:
            state = CusumState.warmed(stress.warm_requests, stress.warm_ticks, start=now)
        on, score, calm = cusum_at(state, now, cusum)
        tripped = bool(state.ever_alarmed)
        out.append(
            {
                "route": route_id,
                "on": on,
                "score": round(score, 3),
                "threshold": stress.threshold,
                "calm_per_second": round(calm * 1000 / tick_ms, 6),
                "last_trip_at": rfc3339(int(state.last_alarm) * tick_ms) if tripped else None,
                "on_until": rfc3339(int(state.last_alarm + cusum.hold + 1) * tick_ms)
                if on
                else None,
                "loss_factor": stress.loss_factor,
            }
        )
    return sorted(out, key=lambda d: (not d["on"], d["route"]))
