"""The gateway application: `create_app(settings, redis_url)`; `app_from_env` is the
factory uvicorn workers call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.routing import Route

from ledger import (
    ARCHIVE_AFTER_MS,
    ChangeFeed,
    Durability,
    Ledger,
    LedgerUnavailable,
    RedisFailure,
    TenantSnapshot,
    cutoff_ms,
    failover_shortfall,
    trim_locked,
)
from pricing import TenantPolicy, policy_accounts

from . import (
    admin,
    console,
    escalations,
    holds_api,
    keys_api,
    logs,
    metrics,
    openapi,
    problems,
    proxy,
    tracing,
)
from .admission import Gate
from .auth import AdminIdentity, gate_of, tenant_admin_auth
from .bodies import BodyLimit
from .fleetwatch import FleetWatch
from .http_upstream import make_client
from .mcp_mount import LazyMcp
from .policies import FileFault
from .problems import Problem
from .readiness import Writes
from .refusals import Flusher
from .settings import GatewaySettings
from .sweeper import Sweeper
from .tenants import TenantStore
from .webhooks import Dispatcher

log = logging.getLogger("irrev.gateway")
LEDGER_START_WAIT_S = 5.0
# How often the policy loop looks at the policy files' sizes and times between
# refreshes: an edit is taken in within this, not within the refresh interval.
FILE_LOOK_S = 0.25
# appendfsync everysec's promise (a write is fsynced within about a second), and how
# often a replica reports its fsyncs (REPLCONF ACK).
FSYNC_REPORT_MS = 1000
# How often a worker reads the fleet's release flag while a rolling upgrade is on.
RELEASE_CHECK_S = 5.0


async def _every(interval_s: float, work: Any, what: str) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await work()
        except Exception:
            log.exception(f"{what} failed; retrying in {interval_s} s")


async def _until_upgraded(ledger: Ledger) -> None:
    """Read the fleet's release flag until it says every host runs this release: a
    worker that learns it late only writes the older formats a while longer, which
    every release reads."""
    while not ledger.release.upgraded:
        await asyncio.sleep(RELEASE_CHECK_S)
        try:
            await ledger.release.read()
        except Exception:
            log.exception(f"reading the fleet's release failed; retrying in {RELEASE_CHECK_S} s")
    log.info("fleet upgraded", extra={"release_format": ledger.release.format})


async def _policy_loop(
    interval_s: float,
    refresh: Callable[[], Awaitable[None]],
    woken: asyncio.Event,
    files_changed: Callable[[], bool],
) -> None:
    """Refresh the policies every `interval_s`, and at once when a policy write is
    announced (`woken`) or a policy file changed (looked at every FILE_LOOK_S: a stat
    per file): a change made anywhere is in force on every host within one interval
    of being made, not up to two (docs/design.md, "Policy changes")."""
    loop = asyncio.get_running_loop()
    failed = False
    while True:
        if failed:
            # Only the interval: a changed file or an announcement would otherwise
            # retry, and log, every FILE_LOOK_S while Redis is down.
            await asyncio.sleep(interval_s)
        else:
            deadline = loop.time() + interval_s
            while (
                not woken.is_set() and not files_changed() and (left := deadline - loop.time()) > 0
            ):
                # asyncio.timeout, not wait_for: in Python 3.11 wait_for swallows a
                # cancellation that races the wakeup (a worker's shutdown, as closing
                # the feed wakes the loop), and the loop never stopped.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(FILE_LOOK_S, left)):
                        await woken.wait()
        woken.clear()
        try:
            await refresh()
            failed = False
        except Exception:
            failed = True
            log.exception(f"policy reload failed; retrying in {interval_s} s")


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


async def _check_durability(ledger: Ledger, settings: GatewaySettings) -> None:
    """Report the server's persistence; refuse to start on one that can lose an
    acknowledged write if IRREV_DURABILITY=require, and whatever IRREV_DURABILITY
    says on one that cannot do the WAITAOF IRREV_WAIT_AOF asks for (every write
    would fail)."""
    found = await ledger.durability()
    if settings.wait_aof != "off" and (refusal := found.wait_aof_refusal()):
        raise LedgerUnavailable("start", RedisFailure.NO_WAITAOF, refusal)
    # The settings do not show an ACL that denies WAITAOF or WAIT, a renamed command,
    # or replicas that do not fsync: a write followed by the very waits shows them.
    probe = await ledger.probe_waits()
    if probe.refusal:
        waits_refused = settings.wait_aof != "off" and not probe.write_refused
        cause = RedisFailure.NO_WAITAOF if waits_refused else RedisFailure.REFUSED
        raise LedgerUnavailable("start", cause, probe.refusal)
    if probe.warning:
        log.warning("ledger waits", extra={"shortfall": probe.warning})
    shortfall = found.shortfall(settings.wait_replicas, probe.fsynced)
    facts = {
        "appendonly": found.appendonly,
        "appendfsync": found.appendfsync,
        "min_replicas_to_write": found.min_replicas_to_write,
        "wait_replicas": settings.wait_replicas,
        "wait_aof": settings.wait_aof,
        "waitaof": found.waitaof,
    }
    if slow := _slow_fsyncs(found, settings):
        log.warning("ledger durability", extra={**facts, "shortfall": slow})
    if not shortfall:
        log.info("ledger durability", extra=facts)
    elif settings.durability == "require":
        raise LedgerUnavailable("start", RedisFailure.NOT_DURABLE, shortfall)
    else:
        log.warning("ledger durability", extra={**facts, "shortfall": shortfall})
    if settings.wait_replicas:
        await _check_topology(ledger, settings.wait_replicas)


def _archive_after_s(setting: float | str, ledger: Ledger) -> float | None:
    """IRREV_ARCHIVE_AFTER_S as the sweeper takes it: None keeps settled holds in
    their tenant's slot."""
    if setting == "auto":
        return ARCHIVE_AFTER_MS / 1000 if ledger.clustered else None
    return None if setting == "off" else float(setting)


async def _check_topology(ledger: Ledger, wait_replicas: int) -> None:
    """Warn when one failure (a replica's death, a failover) would leave a primary
    with fewer replicas than IRREV_WAIT_REPLICAS: admissions there would then fail
    closed until it is back. A warning, not a refusal: it serves until then."""
    replicas = await ledger.replicas_per_primary()
    facts: dict[str, Any] = {"wait_replicas": wait_replicas, "replicas": replicas}
    if replicas is None:
        shortfall = (
            "the replicas of each primary could not be read (INFO replication or CLUSTER "
            f"NODES refused): make sure each has {wait_replicas + 1}, or one failure stops "
            "admissions"
        )
    else:
        shortfall = failover_shortfall(replicas, wait_replicas)
    if shortfall:
        log.warning("ledger topology", extra={**facts, "shortfall": shortfall})
    else:
        log.info("ledger topology", extra=facts)


def _slow_fsyncs(found: Durability, settings: GatewaySettings) -> str:
    """Why IRREV_WAIT_TIMEOUT_MS is likely too short for the fsyncs IRREV_WAIT_AOF
    waits for ("" if not): writes would fail closed. With everysec, WAITAOF waits for
    the next fsync (measured ~100 ms on Valkey 8, within a second by the setting's
    promise); replicas report their fsyncs once a second (measured ~1 s a write)."""
    timeout = settings.wait_timeout_ms
    if settings.wait_aof == "all" and settings.wait_replicas and timeout < 2 * FSYNC_REPORT_MS:
        return (
            f"replicas report their fsyncs about every {FSYNC_REPORT_MS} ms and "
            f"IRREV_WAIT_TIMEOUT_MS is {timeout}: writes may fail with not_replicated"
        )
    everysec = "everysec" in found.appendfsync.split("|")
    if settings.wait_aof != "off" and everysec and timeout < FSYNC_REPORT_MS:
        return (
            f"appendfsync everysec fsyncs up to {FSYNC_REPORT_MS} ms after a write and "
            f"IRREV_WAIT_TIMEOUT_MS is {timeout}: writes may fail with not_fsynced"
        )
    return ""


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


def create_app(settings: GatewaySettings, redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ledger = Ledger.from_url(
            redis_url,
            retention_ms=settings.retention_s * 1000,
            denied_retention_ms=settings.denied_retention_s * 1000,
            replicas=settings.wait_replicas,
            replica_timeout_ms=settings.wait_timeout_ms,
            wait_aof=settings.wait_aof,
            migration_wait_s=settings.migration_wait_s,
        )
        ledger.on_unacknowledged = lambda op: metrics.UNACKNOWLEDGED_WRITES.labels(op).inc()
        http = make_client(
            settings.upstream_connect_timeout_s,
            settings.upstream_timeout_s,
            settings.upstream_max_connections,
        )
        traced.client(http)
        tenants = TenantStore(
            settings.policy_dir,
            settings.forward_budget(),
            settings.mcp_supervision(),
            settings.instance,
        )
        await _load_scripts(ledger)
        await ledger.release.read()
        if not ledger.release.upgraded:
            log.warning(
                "fleet in a rolling upgrade",
                extra={
                    "release_format": ledger.release.format,
                    "writes": "records every release since format 1 reads, until "
                    "`irrev ledger upgrade finish` (docs/operations.md, Rolling upgrades)",
                },
            )
        await _check_durability(ledger, settings)
        # A file that does not load is reported (log, /metrics, /readyz) and leaves the
        # other tenants served: `irrev serve` refused it at start, so it broke since.
        await tenants.apply(ledger)
        await tenants.keyring.reload(ledger, frozenset(tenants.policies))
        gate = Gate(settings, ledger, tenants, http)
        app.state.gate = gate
        flusher = Flusher(gate.refusals, ledger, settings.refusals_flush_s)
        flusher.start()
        # Policy writes and given-up leases are announced (pub/sub): an idle worker
        # reads the store's epoch when told, or when its subscription came back, not
        # every refresh, and asks for leases it does not hold seldom.
        feed = ChangeFeed(redis_url)
        feed.start()
        # One process of the fleet polls for all (a lapsed lease, a lost announcement
        # or epoch bump), so the others' idle load does not grow with their number.
        watch = FleetWatch(
            ledger, feed, settings.policy_poll_s, settings.policy_full_read_s, settings.instance
        )
        watch.start()
        dispatcher = Dispatcher(ledger, tenants, settings.webhook_pacing(), feed)
        await dispatcher.start()

        async def refresh_policies() -> None:
            await tenants.refresh(ledger, feed, settings.policy_poll_s, settings.policy_full_read_s)
            dispatcher.refresh()  # a reload may have given a tenant a webhook
            await tenants.keyring.refresh(
                ledger,
                list(tenants.policies),
                feed,
                settings.policy_poll_s,
                settings.policy_full_read_s,
            )

        sweeper = Sweeper(
            ledger,
            settings.sweep_interval_s,
            settings.instance,
            feed,
            settings.account_close_interval_s,
            _archive_after_s(settings.archive_after_s, ledger),
        )
        app.state.sweeper = sweeper
        # A first round now: the tenants' leases are taken before the first scrape,
        # which reports fleet gauges only for the tenants this gateway sweeps.
        with contextlib.suppress(Exception):
            await sweeper.round(list(tenants.policies))

        async def sweep() -> None:
            await sweeper.round(list(tenants.policies))

        archive_dir = settings.archive_dir()

        async def trim_journals() -> None:
            before_ms = await cutoff_ms(ledger, settings.journal_keep_s)
            # The tenant's sweeper trims its journal too: one process of the fleet.
            for tenant in filter(sweeper.holds, list(tenants.policies)):
                trimmed = await trim_locked(ledger, tenant, archive_dir, before_ms)
                if trimmed:
                    metrics.JOURNAL_TRIMMED.labels(tenant).inc(trimmed)
                    log.info("journal trimmed", extra={"tenant": tenant, "entries": trimmed})

        async def flush_keys_used() -> None:
            await tenants.keyring.flush(ledger)

        background = [
            asyncio.create_task(_every(settings.sweep_interval_s, sweep, "sweep")),
            asyncio.create_task(
                _every(settings.keys_used_flush_s, flush_keys_used, "recording keys' use")
            ),
            asyncio.create_task(
                _policy_loop(
                    settings.policy_check_interval_s,
                    refresh_policies,
                    feed.wakeup("policy", "keys"),
                    tenants.files_changed,
                )
            ),
        ]
        if not ledger.release.upgraded:
            background.append(asyncio.create_task(_until_upgraded(ledger)))
        if settings.journal_keep_s > 0:
            trimmer = _every(settings.journal_trim_interval_s, trim_journals, "journal trim")
            background.append(asyncio.create_task(trimmer))
        log.info("gateway ready", extra={"tenants": sorted(tenants.policies), "pid": os.getpid()})
        try:
            yield
        finally:
            await mcp_endpoint.aclose()
            await gate.resettle.aclose()
            await flusher.aclose()  # after the last answers: their refusals are counted
            await dispatcher.aclose()
            await watch.aclose()
            await feed.aclose()
            await tenants.aclose()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await tenants.keyring.flush(ledger)  # the uses since the last flush
            await sweeper.release()
            await http.aclose()
            await ledger.aclose()
            traced.shutdown()

    app = FastAPI(
        title="irrev gateway",
        description="Fleet-wide irreversibility budget admission controller.",
        version=metrics.build_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    traced = tracing.setup(app)
    openapi.install(app)
    problems.install(app)
    # Inside the request-id middleware, so that a refused body is logged and counted.
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        policy_limit=settings.max_policy_bytes,
        timeout_s=settings.body_timeout_s,
    )
    app.add_middleware(logs.RequestIdMiddleware)
    mcp_endpoint = LazyMcp()
    # No GET: a stateless endpoint never pushes anything, and a GET event stream would
    # stay open for ever, one file descriptor each, from any agent's token.
    app.router.routes.append(Route("/mcp", mcp_endpoint, methods=["POST", "DELETE"]))
    routers = (
        proxy.router,
        holds_api.router,
        escalations.router,
        admin.router,
        keys_api.router,
        console.router,
    )
    for router in routers:
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    writes = Writes()

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> dict[str, Any]:
        """503 without the ledger, and while it refuses writes (a probe write, at most
        one a second per worker: gateway/readiness.py): a load balancer then sends
        effects, which this gateway could only refuse, to one whose Redis takes them.
        "degraded" (still 200: every tenant is served, a failing one by the policy it
        had) while policy files do not load, or while some but not all primaries of
        a Redis Cluster refuse writes (every gateway shares them: sending elsewhere
        serves no tenant better, and stopping them all would stop the tenants whose
        slots take writes); only an admin learns which tenants (its own, or all for
        an operator), and an operator why primaries refuse."""
        gate = gate_of(request)
        try:
            await gate.ledger.ping()
            if not await gate.ledger.scripts_loaded():
                await gate.ledger.load_scripts()
            probe = await writes.probe(gate.ledger)
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

    # The fleet gauges as the last scrape by anyone but an operator read them, by
    # whether they were read with tenant labels: (monotonic time, snapshots).
    shared: dict[bool, tuple[float, list[TenantSnapshot]]] = {}

    @app.get("/metrics", tags=["health"])
    async def metrics_endpoint(request: Request) -> Response:
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
        gate = gate_of(request)
        admin = await _admin(request)
        operator = admin is not None and admin.operator
        tenant_labels = settings.metrics_tenant_labels or operator
        cached = None if operator else shared.get(tenant_labels)
        if cached is not None and time.monotonic() - cached[0] < settings.metrics_cache_s:
            snapshots = cached[1]
        else:
            snapshots = await _fleet_gauges(gate.ledger, gate.tenants.policies, tenant_labels)
            if not operator:
                shared[tenant_labels] = (time.monotonic(), snapshots)
        state = metrics.PolicyState(gate.tenants.versions())
        for fault in gate.tenants.faults:
            state.failing[fault.tenant] = state.failing.get(fault.tenant, 0) + 1
        exposition = metrics.exposition(snapshots, state, tenant_labels=tenant_labels)
        return Response(exposition, media_type="text/plain; version=0.0.4")

    async def _fleet_gauges(
        ledger: Ledger, policies: dict[str, TenantPolicy], tenant_labels: bool
    ) -> list[TenantSnapshot]:
        """The fleet gauges' state from Redis ([] when it cannot be read: the scrape
        still answers with each worker's own series)."""
        with contextlib.suppress(Exception):
            reported = await app.state.sweeper.reporting(list(policies))
            accounts = {
                tenant: metered_accounts(policies[tenant], settings.metrics_agent_accounts)
                if tenant_labels
                else []
                for tenant in reported
            }
            return await ledger.snapshot(accounts, holds=tenant_labels)
        return []

    return app


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


def app_from_env() -> FastAPI:
    """For uvicorn workers: settings and the Redis URL from the environment."""
    settings = GatewaySettings()
    url = os.environ.get("IRREV_REDIS_URL")
    if not url:
        raise RuntimeError("IRREV_REDIS_URL must be set for gateway workers (irrev serve sets it)")
    logs.configure(settings.log_level)
    return create_app(settings, url)
