"""A worker's life between its start and its stop: the ledger, the policies and the
jobs it serves with, started in order (each needs those before it) and stopped in an
order that lets what the last answers counted or queued be written before the
connections close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.edge import metrics
from gateway.pipeline.prepare import Gate
from gateway.settings import GatewaySettings
from gateway.state import ledger_checks
from gateway.state.fleetwatch import FleetWatch
from gateway.state.http_upstream import make_client
from gateway.state.loops import every, policy_loop, until_upgraded
from gateway.state.refusals import Flusher
from gateway.state.sweeper import Sweeper
from gateway.state.tenants import TenantStore
from gateway.state.webhooks import Dispatcher
from ledger import ARCHIVE_AFTER_MS, ChangeFeed, Ledger, cutoff_ms, stop_tasks, trim_locked

log = logging.getLogger("irrev.gateway")


@dataclass
class Running:
    """What a started worker runs: its gate (ledger, tenants, upstream client) and the
    jobs beside the requests, until `aclose`."""

    settings: GatewaySettings
    gate: Gate
    flusher: Flusher
    feed: ChangeFeed
    watch: FleetWatch
    dispatcher: Dispatcher
    sweeper: Sweeper
    background: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def ledger(self) -> Ledger:
        return self.gate.ledger

    @property
    def tenants(self) -> TenantStore:
        return self.gate.tenants

    async def aclose(self) -> None:
        await self.gate.resettle.aclose()
        await self.flusher.aclose()  # after the last answers: their refusals are counted
        await self.dispatcher.aclose()
        await self.watch.aclose()
        await self.feed.aclose()
        await self.tenants.aclose()
        await stop_tasks(self.background)
        with contextlib.suppress(Exception):
            await self.tenants.keyring.flush(self.ledger)  # the uses since the last flush
        await self.sweeper.release()
        await self.gate.http.aclose()
        await self.ledger.aclose()

    def _loops(self, archive_dir: Path) -> list[asyncio.Task[None]]:
        settings = self.settings
        tenants = self.tenants

        async def sweep() -> None:
            await self.sweeper.round(list(tenants.policies))

        async def flush_keys_used() -> None:
            await tenants.keyring.flush(self.ledger)

        async def trim_journals() -> None:
            await self._trim_journals(archive_dir)

        jobs = [
            every(settings.sweep_interval_s, sweep, "sweep"),
            every(settings.keys_used_flush_s, flush_keys_used, "recording keys' use"),
            policy_loop(
                settings.policy_check_interval_s,
                self._refresh_policies,
                self.feed.wakeup("policy", "keys"),
                tenants.files_changed,
            ),
        ]
        if not self.ledger.release.upgraded:
            jobs.append(until_upgraded(self.ledger))
        if settings.journal_keep_s > 0:
            jobs.append(every(settings.journal_trim_interval_s, trim_journals, "journal trim"))
        return [asyncio.create_task(job) for job in jobs]

    async def _refresh_policies(self) -> None:
        settings, tenants, feed = self.settings, self.tenants, self.feed
        await tenants.refresh(
            self.ledger, feed, settings.policy_poll_s, settings.policy_full_read_s
        )
        self.dispatcher.refresh()  # a reload may have given a tenant a webhook
        await tenants.keyring.refresh(
            self.ledger,
            list(tenants.policies),
            feed,
            settings.policy_poll_s,
            settings.policy_full_read_s,
        )

    async def _trim_journals(self, archive_dir: Path) -> None:
        before_ms = await cutoff_ms(self.ledger, self.settings.journal_keep_s)
        # The tenant's sweeper trims its journal too: one process of the fleet.
        for tenant in filter(self.sweeper.holds, list(self.tenants.policies)):
            trimmed = await trim_locked(self.ledger, tenant, archive_dir, before_ms)
            if trimmed:
                metrics.JOURNAL_TRIMMED.labels(tenant).inc(trimmed)
                log.info("journal trimmed", extra={"tenant": tenant, "entries": trimmed})


async def start(
    settings: GatewaySettings, redis_url: str, instrument: Callable[[httpx.AsyncClient], None]
) -> Running:
    """Start a worker's ledger, policies and jobs; `instrument` traces the upstream
    client."""
    gate = await _gate(settings, redis_url, instrument)
    ledger, tenants = gate.ledger, gate.tenants
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
    sweeper = Sweeper(
        ledger,
        settings.sweep_interval_s,
        settings.instance,
        feed,
        settings.account_close_interval_s,
        _archive_after_s(settings.archive_after_s, ledger),
    )
    running = Running(settings, gate, flusher, feed, watch, dispatcher, sweeper)
    # A first round now: the tenants' leases are taken before the first scrape,
    # which reports fleet gauges only for the tenants this gateway sweeps.
    with contextlib.suppress(Exception):
        await sweeper.round(list(tenants.policies))
    running.background = running._loops(settings.archive_dir())
    log.info("gateway ready", extra={"tenants": sorted(tenants.policies), "pid": os.getpid()})
    return running


async def _gate(
    settings: GatewaySettings, redis_url: str, instrument: Callable[[httpx.AsyncClient], None]
) -> Gate:
    """The ledger checked and the policies applied: what requests are admitted with."""
    ledger = Ledger.from_url(
        redis_url,
        retention_ms=settings.retention_s * 1000,
        denied_retention_ms=settings.denied_retention_s * 1000,
        replicas=settings.wait_replicas,
        replica_timeout_ms=settings.wait_timeout_ms,
        wait_aof=settings.wait_aof,
        migration_wait_s=settings.migration_wait_s,
        group_wait_ms=settings.group_wait_ms,
    )
    ledger.on_unacknowledged = lambda op: metrics.UNACKNOWLEDGED_WRITES.labels(op).inc()
    ledger.on_group = lambda op, size: metrics.LEDGER_GROUPS.labels(op).observe(size)
    http = make_client(
        settings.upstream_connect_timeout_s,
        settings.upstream_timeout_s,
        settings.upstream_max_connections,
    )
    instrument(http)
    tenants = TenantStore(
        settings.policy_dir,
        settings.forward_budget(),
        settings.mcp_supervision(),
        settings.instance,
    )
    await ledger_checks.load_scripts(ledger)
    await ledger_checks.read_release(ledger)
    await ledger_checks.check_durability(ledger, settings)
    # A file that does not load is reported (log, /metrics, /readyz) and leaves the
    # other tenants served: `irrev serve` refused it at start, so it broke since.
    await tenants.apply(ledger)
    await tenants.keyring.reload(ledger, frozenset(tenants.policies))
    return Gate(settings, ledger, tenants, http)


def _archive_after_s(setting: float | str, ledger: Ledger) -> float | None:
    """IRREV_ARCHIVE_AFTER_S as the sweeper takes it: None keeps settled holds in
    their tenant's slot."""
    if setting == "auto":
        return ARCHIVE_AFTER_MS / 1000 if ledger.clustered else None
    return None if setting == "off" else float(setting)
