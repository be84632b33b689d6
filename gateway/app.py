"""The gateway application: `create_app(settings, redis_url)`; `app_from_env` is the
factory uvicorn workers call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route

from ledger import Ledger, LedgerUnavailable, cutoff_ms, trim_locked

from . import (
    admin,
    console,
    escalations,
    holds_api,
    logs,
    metrics,
    problems,
    proxy,
)
from .admission import Gate
from .auth import admin_auth, gate_of
from .http_upstream import make_client
from .mcp_mount import LazyMcp
from .problems import Problem
from .settings import GatewaySettings
from .tenants import TenantStore

log = logging.getLogger("irrev.gateway")
LEDGER_START_WAIT_S = 5.0


async def _every(interval_s: float, work: Any, what: str) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await work()
        except Exception:
            log.exception(f"{what} failed; retrying in {interval_s} s")


async def _load_scripts(ledger: Ledger) -> None:
    """A worker replaced while `irrev serve` restarts its embedded Redis waits for it
    (a worker that cannot start stops the whole gateway); a Redis still unreachable
    after LEDGER_START_WAIT_S fails the start."""
    deadline = time.monotonic() + LEDGER_START_WAIT_S
    while True:
        try:
            await ledger.load_scripts()
            return
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def create_app(settings: GatewaySettings, redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ledger = Ledger.from_url(
            redis_url,
            retention_ms=settings.retention_s * 1000,
            denied_retention_ms=settings.denied_retention_s * 1000,
            replicas=settings.wait_replicas,
            replica_timeout_ms=settings.wait_timeout_ms,
        )
        http = make_client(
            settings.upstream_connect_timeout_s,
            settings.upstream_timeout_s,
            settings.upstream_max_connections,
        )
        tenants = TenantStore(settings.policy_dir, settings.forward_budget())
        await _load_scripts(ledger)
        await tenants.load(ledger)
        gate = Gate(settings, ledger, tenants, http)
        app.state.gate = gate

        async def sweep() -> None:
            for tenant in tenants.policies:
                await ledger.sweep(tenant, batch=200)

        archive_dir = settings.archive_dir()

        async def trim_journals() -> None:
            before_ms = await cutoff_ms(ledger, settings.journal_keep_s)
            for tenant in tenants.policies:
                trimmed = await trim_locked(ledger, tenant, archive_dir, before_ms)
                if trimmed:
                    metrics.JOURNAL_TRIMMED.labels(tenant).inc(trimmed)
                    log.info("journal trimmed", extra={"tenant": tenant, "entries": trimmed})

        background = [
            asyncio.create_task(_every(settings.sweep_interval_s, sweep, "sweep")),
            asyncio.create_task(
                _every(
                    settings.policy_check_interval_s,
                    lambda: tenants.refresh(ledger),
                    "policy reload",
                )
            ),
        ]
        if settings.journal_keep_s > 0:
            trimmer = _every(settings.journal_trim_interval_s, trim_journals, "journal trim")
            background.append(asyncio.create_task(trimmer))
        log.info("gateway ready", extra={"tenants": sorted(tenants.policies), "pid": os.getpid()})
        try:
            yield
        finally:
            await mcp_endpoint.aclose()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await http.aclose()
            await ledger.aclose()

    app = FastAPI(
        title="irrev gateway",
        description="Fleet-wide irreversibility budget admission controller.",
        version="0.1.0",
        lifespan=lifespan,
    )
    problems.install(app)
    app.add_middleware(logs.RequestIdMiddleware)
    mcp_endpoint = LazyMcp()
    app.router.routes.append(Route("/mcp", mcp_endpoint, methods=["GET", "POST", "DELETE"]))
    routers = (proxy.router, holds_api.router, escalations.router, admin.router, console.router)
    for router in routers:
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> dict[str, Any]:
        gate = gate_of(request)
        try:
            await gate.ledger.ping()
            if not await gate.ledger.scripts_loaded():
                await gate.ledger.load_scripts()
        except Exception as exc:
            raise Problem(
                503, "ledger_unavailable", f"not ready: {exc}", headers={"Retry-After": "1"}
            ) from exc
        # Unauthenticated: which tenants this gateway serves is theirs to tell.
        return {"status": "ready"}

    @app.get("/metrics", tags=["health"])
    async def metrics_endpoint(request: Request) -> Response:
        """Tenant labels for an admin token or with IRREV_METRICS_TENANT_LABELS; anyone
        else gets the same series summed over tenants."""
        gate = gate_of(request)
        tenant_labels = settings.metrics_tenant_labels or await _is_admin(request)
        counts: dict[tuple[str, str], int] = {}
        with contextlib.suppress(Exception):
            for tenant in gate.tenants.policies:
                for state, count in (await gate.ledger.live_counts(tenant)).items():
                    counts[(tenant, state)] = count
        exposition = metrics.exposition(counts, tenant_labels=tenant_labels)
        return Response(exposition, media_type="text/plain; version=0.0.4")

    return app


async def _is_admin(request: Request) -> bool:
    try:
        await admin_auth(request)
    except Problem:
        return False
    return True


def app_from_env() -> FastAPI:
    """For uvicorn workers: settings and the Redis URL from the environment."""
    settings = GatewaySettings()
    url = os.environ.get("IRREV_REDIS_URL")
    if not url:
        raise RuntimeError("IRREV_REDIS_URL must be set for gateway workers (irrev serve sets it)")
    logs.configure(settings.log_level)
    return create_app(settings, url)
