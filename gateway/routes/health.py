"""`/healthz`, `/readyz` and `/metrics`: what load balancers and scrapers ask of a
worker."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from gateway.edge import metrics
from gateway.edge.auth import AdminIdentity, tenant_admin_auth
from gateway.edge.problems import Problem
from gateway.pipeline.prepare import Gate
from gateway.routes.readiness import Writes
from gateway.settings import GatewaySettings
from gateway.state.policies import FileFault
from ledger import Ledger, TenantSnapshot
from pricing import TenantPolicy, policy_accounts


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class Health:
    """The routes of one app, with what they keep between calls: the last probe
    write (/readyz) and the fleet gauges scrapes share (/metrics)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.writes = Writes()
        # The fleet gauges as the last scrape by anyone but an operator read them, by
        # whether they were read with tenant labels: (monotonic time, snapshots).
        self.shared: dict[bool, tuple[float, list[TenantSnapshot]]] = {}

    def router(self) -> APIRouter:
        router = APIRouter(tags=["health"])
        router.add_api_route("/healthz", healthz, methods=["GET"])
        router.add_api_route("/readyz", self.readyz, methods=["GET"])
        router.add_api_route("/metrics", self.metrics_endpoint, methods=["GET"])
        return router

    async def readyz(self, request: Request) -> dict[str, Any]:
        """503 without the ledger, and while it refuses writes (a probe write, at most
        one a second per worker: gateway/routes/readiness.py): a load balancer then sends
        effects, which this gateway could only refuse, to one whose Redis takes them.
        "degraded" (still 200: every tenant is served, a failing one by the policy it
        had) while policy files do not load, or while some but not all primaries of
        a Redis Cluster refuse writes (every gateway shares them: sending elsewhere
        serves no tenant better, and stopping them all would stop the tenants whose
        slots take writes); only an admin learns which tenants (its own, or all for
        an operator), and an operator why primaries refuse."""
        gate = Gate.of(request)
        try:
            await gate.ledger.ping()
            if not await gate.ledger.scripts_loaded():
                await gate.ledger.load_scripts()
            probe = await self.writes.probe(gate.ledger)
        except Exception as exc:
            raise _not_ready(str(exc)) from exc
        if probe.refused:
            raise _not_ready(f"Redis refuses writes: {probe.refusals[0]}")
        faults = gate.tenants.faults
        if not faults and not probe.refusals:
            # Unauthenticated: which tenants this gateway serves is theirs to tell.
            return {"status": "ready"}
        answer: dict[str, Any] = {"status": "degraded"}
        admin = await _admin(request)
        if faults:
            answer.update(_faults_view(faults, admin))
        if probe.refusals:
            answer["primaries_refusing_writes"] = len(probe.refusals)
            if admin is not None and admin.operator:
                answer["write_refusals"] = list(probe.refusals)
        return answer

    async def metrics_endpoint(self, request: Request) -> Response:
        """Tenant labels (and the gauges that name accounts or differ per tenant) for
        an operator's token or with IRREV_METRICS_TENANT_LABELS; anyone else gets the
        same series summed over tenants, and over the admins and tools they name.
        Fleet gauges are read from Redis now, by this worker alone (Ledger.snapshot:
        two round trips for every tenant), and only for the tenants this gateway
        sweeps: each tenant's come from one gateway of the fleet, so summing a series
        over instances counts it once. Without tenant labels no account or hold is
        shown, so none is read: the live counts only (a scrape read every escalated
        and ambiguous hold, and anyone may scrape). A scrape by anyone but an
        operator reuses what such a scrape read within IRREV_METRICS_CACHE_S: with
        IRREV_METRICS_TENANT_LABELS it reads every waiting hold."""
        settings = self.settings
        gate = Gate.of(request)
        admin = await _admin(request)
        operator = admin is not None and admin.operator
        tenant_labels = settings.metrics_tenant_labels or operator
        cached = None if operator else self.shared.get(tenant_labels)
        if cached is not None and time.monotonic() - cached[0] < settings.metrics_cache_s:
            snapshots = cached[1]
        else:
            snapshots = await self._fleet_gauges(
                request.app, gate.ledger, gate.tenants.policies, tenant_labels
            )
            if not operator:
                self.shared[tenant_labels] = (time.monotonic(), snapshots)
        state = metrics.PolicyState(gate.tenants.versions())
        for fault in gate.tenants.faults:
            state.failing[fault.tenant] = state.failing.get(fault.tenant, 0) + 1
        exposition = metrics.exposition(snapshots, state, tenant_labels=tenant_labels)
        return Response(exposition, media_type="text/plain; version=0.0.4")

    async def _fleet_gauges(
        self,
        app: FastAPI,
        ledger: Ledger,
        policies: dict[str, TenantPolicy],
        tenant_labels: bool,
    ) -> list[TenantSnapshot]:
        """The fleet gauges' state from Redis ([] when it cannot be read: the scrape
        still answers with each worker's own series)."""
        agents = self.settings.metrics_agent_accounts
        with contextlib.suppress(Exception):
            reported = await app.state.sweeper.reporting(list(policies))
            accounts = {
                tenant: metered_accounts(policies[tenant], agents) if tenant_labels else []
                for tenant in reported
            }
            return await ledger.snapshot(accounts, holds=tenant_labels)
        return []


def metered_accounts(policy: TenantPolicy, agents: bool) -> list[str]:
    """The accounts /metrics reports budgets of: the tenant's, its principals' and its
    named risk factors' (as many as the policy names), and its agents' only with
    IRREV_METRICS_AGENT_ACCOUNTS (a series per agent). Accounts a factor pattern
    opens (`customer:*`: one per customer) never: the admin API lists them."""
    return [
        spec.account_id
        for spec in policy_accounts(policy)
        if agents or not spec.account_id.startswith("agent:")
    ]


def _faults_view(faults: list[FileFault], admin: AdminIdentity | None) -> dict[str, Any]:
    """How many policy files do not load; for an admin, which of its tenants that
    leaves degraded, and for an operator which files."""
    view: dict[str, Any] = {"policy_files_failing": len(faults)}
    if admin is not None:
        shown = [f for f in faults if admin.sees(f.tenant) and (admin.operator or f.tenant)]
        view["tenants_degraded"] = sorted({f.tenant for f in shown if f.tenant})
        if admin.operator:
            view["files_failing"] = sorted(str(f.path) for f in faults)
    return view


def _not_ready(why: str) -> Problem:
    return Problem(503, "ledger_unavailable", f"not ready: {why}", headers={"Retry-After": "1"})


async def _admin(request: Request) -> AdminIdentity | None:
    try:
        return await tenant_admin_auth(request)
    except Problem:
        return None
