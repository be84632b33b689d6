"""Resolving ambiguous holds: ask the upstream by idempotency key where the route
says how; otherwise leave the hold charged and list it for an operator. A "not
found" only voids a hold past its deadline, when no forward can still be in flight."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from gateway.edge import metrics
from gateway.edge.canonical import read_request
from gateway.edge.problems import Problem
from gateway.edge.wire import StoredAnswer, StoredRequest, upstream_key
from gateway.pipeline.deliver import kept_allowance, recorded
from gateway.pipeline.prepare import Gate, target_of
from gateway.pipeline.upstream import Answer, Fate, HttpMeta
from ledger import AnswerAllowance, HoldNotDue, HoldState, HoldStateConflict
from pricing import RequestError, TenantPolicy, price_request

log = logging.getLogger("irrev.gateway")


@dataclass
class Reconciliation:
    posted: list[str] = field(default_factory=list)
    voided: list[str] = field(default_factory=list)
    unresolved: dict[str, str] = field(default_factory=dict)


async def reconcile(gate: Gate, policy: TenantPolicy) -> Reconciliation:
    """Resolve what can be; a log line per hold (whose effect, which route, what it
    cost, and the result) and the counts by result."""
    requests: dict[str, StoredRequest] = {}
    report = await _reconcile(gate, policy, requests)
    tenant = policy.tenant

    def about(hold_id: str) -> dict[str, object]:
        request = requests.get(hold_id)
        return {
            "tenant": tenant,
            "hold_id": hold_id,
            "agent": request.agent if request else None,
            "route": request.route_id if request else None,
            "price": request.price if request else None,
        }

    for result, holds in (("posted", report.posted), ("voided", report.voided)):
        metrics.RECONCILED.labels(tenant, result).inc(len(holds))
        for hold_id in holds:
            log.info("reconciled", extra={**about(hold_id), "result": result})
    metrics.RECONCILED.labels(tenant, "unresolved").inc(len(report.unresolved))
    for hold_id, why in report.unresolved.items():
        log.warning("reconciled", extra={**about(hold_id), "result": "unresolved", "reason": why})
    return report


async def _reconcile(
    gate: Gate, policy: TenantPolicy, requests: dict[str, StoredRequest]
) -> Reconciliation:
    """`requests`: filled with each ambiguous hold's recorded request, for the log."""
    tenant = policy.tenant
    report = Reconciliation()
    await gate.ledger.sweep(tenant, batch=1000)
    for hold_id in await gate.ledger.hold_ids(tenant, HoldState.AMBIGUOUS):
        hold = await gate.ledger.hold(tenant, hold_id)
        if hold is None or hold.state is not HoldState.AMBIGUOUS:
            continue
        if not hold.request:
            report.unresolved[hold_id] = "no request recorded: resolve by hand"
            continue
        requests[hold_id] = StoredRequest.loads(hold.request)
        try:
            verdict = await _ask_upstream(gate, policy, hold_id, requests[hold_id])
        except (RequestError, Problem) as exc:
            # The policy changed since (its route or tool removed): this hold stays
            # charged for an operator, and the tenant's other holds are still resolved.
            report.unresolved[hold_id] = f"not priceable under the current policy ({exc})"
            continue
        if verdict is None:
            report.unresolved[hold_id] = "the route has no lookup, or the upstream did not answer"
            continue
        kept = recorded(requests[hold_id], verdict)
        # The lookup's answer counts against its agent's allowance of kept answer
        # bytes, as the forward's would: else an agent whose calls end ambiguous
        # (a tool answering 5xx) has every one kept whole.
        allowance = kept_allowance(policy, kept)
        if verdict.fate is Fate.DELIVERED:
            price = requests[hold_id].price
            outcome = kept.dumps()
            await gate.ledger.post(tenant, hold_id, price, outcome=outcome, allowance=allowance)
            report.posted.append(hold_id)
        else:
            await _void_if_due(gate, tenant, hold_id, kept, allowance, report)
    return report


async def _void_if_due(
    gate: Gate,
    tenant: str,
    hold_id: str,
    verdict: StoredAnswer,
    allowance: AnswerAllowance | None,
    report: Reconciliation,
) -> None:
    """A "not found" proves the effect never fired only once no forward or retry of it
    can still arrive: the ledger voids only past the hold's deadline (Redis time),
    which a retry moves past its own request (contract 6)."""
    try:
        outcome = verdict.dumps()
        await gate.ledger.void(tenant, hold_id, outcome=outcome, due_only=True, allowance=allowance)
    except HoldNotDue:
        report.unresolved[hold_id] = "not found yet, but a forward may still be on its way"
    except HoldStateConflict as exc:
        report.unresolved[hold_id] = f"settled meanwhile: {exc.state.value}"
    else:
        report.voided.append(hold_id)


async def _ask_upstream(
    gate: Gate, policy: TenantPolicy, hold_id: str, request: StoredRequest
) -> Answer | None:
    """What the route's lookup says of the effect: delivered (it took effect), refused
    (it never did), None if it cannot tell."""
    types = [request.content_type] if request.content_type else []
    canonical = read_request(request.query, types, request.body)
    effect = price_request(
        policy,
        request.tool,
        request.method,
        request.path,
        canonical.query_map,
        canonical.document,
        canonical.body_format,
    )
    lookup = effect.lookup_request(upstream_key(hold_id))
    if lookup is None:
        return None
    method, target = lookup
    mcp = gate.tenants.mcp_upstream(policy.tenant, request.tool)
    if mcp is not None:
        deadline = time.monotonic() + gate.settings.upstream_timeout_s
        return await mcp.reconciled(target.removeprefix("/"), hold_id, deadline)
    upstream = target_of(gate, policy, request.tool)
    try:
        response = await gate.http.request(
            method, upstream.base_url.rstrip("/") + target, headers=dict(upstream.credentials)
        )
    except httpx.HTTPError:
        return None
    # The lookup contract (docs/policy.md): a 2xx is found, a 404 not found.
    status = response.status_code
    if status // 100 != 2 and status != 404:
        return None
    kept = tuple(
        (k, v) for k, v in response.headers.multi_items() if k.lower() in upstream.kept_headers
    )
    return Answer(
        fate=Fate.DELIVERED if status // 100 == 2 else Fate.REFUSED,
        payload=response.content,
        media_type=response.headers.get("content-type", ""),
        http=HttpMeta(status, kept),
    )
