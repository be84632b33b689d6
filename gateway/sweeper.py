"""One sweeper per tenant across the fleet: each gateway process tries for a
tenant's sweep lease (Ledger.lease) and sweeps only the tenants whose lease it
holds. The holder renews its lease every round; a process that lost the race asks
again only once a lease could have lapsed, so Redis sees O(tenants) sweeps and
renewals per interval, plus O(processes x tenants) lease asks per ttl.

A holder that stops (crash, SIGKILL, shutdown without release) leaves its tenants
unswept for at most the lease ttl; sweeping is a safety net (holds past their
deadline are also settled by their own scripts when next touched), so a few
seconds' pause costs nothing but freshness. Two holders for a round (a paused
holder whose lease lapsed) are harmless: what a sweep settles it decides on Redis
time inside its script."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable

from ledger import Lease, Ledger

from . import metrics

log = logging.getLogger("irrev.gateway")
SWEEP_BATCH = 200
# A lease outlives this many sweep intervals, so a holder's late round does not lose it.
LEASE_INTERVALS = 3
MIN_LEASE_S = 3.0


class Sweeper:
    """`instance` names this gateway (all the workers of one `irrev serve`): its
    leases' tokens start with it, so any of its workers can tell which tenants its
    gateway sweeps (and reports the fleet gauges of)."""

    def __init__(self, ledger: Ledger, interval_s: float, instance: str = "") -> None:
        self.ledger = ledger
        self.ttl_s = max(LEASE_INTERVALS * interval_s, MIN_LEASE_S)
        self.instance = instance
        self._leases: dict[str, Lease] = {}
        self._next_ask: dict[str, float] = {}

    def holds(self, tenant: str) -> bool:
        """Whether this process is surely the tenant's sweeper now (also: whoever
        does the tenant's other once-per-fleet work)."""
        lease = self._leases.get(tenant)
        return lease is not None and lease.held

    async def round(self, tenants: Iterable[str]) -> int:
        """Sweep every tenant whose lease this process holds or can take; the number
        swept."""
        swept = 0
        for tenant in tenants:
            if await self._lease(tenant):
                await self.ledger.sweep(tenant, batch=SWEEP_BATCH)
                metrics.SWEEPS.labels(tenant).inc()
                swept += 1
        return swept

    async def _lease(self, tenant: str) -> bool:
        lease = self._leases.get(tenant)
        if lease is None:
            holder = f"{self.instance}/{os.getpid()}" if self.instance else ""
            lease = self.ledger.lease(tenant, "sweep", self._ttl_ms, holder=holder)
            self._leases[tenant] = lease
        now = time.monotonic()
        if not lease.held and now < self._next_ask.get(tenant, 0.0):
            return False
        if await lease.hold():
            return True
        self._next_ask[tenant] = now + self.ttl_s
        return False

    async def reporting(self, tenants: Iterable[str]) -> list[str]:
        """The `tenants` whose fleet gauges this gateway reports: those one of its
        workers sweeps (one gateway of the fleet per tenant), or, for a gateway with
        no instance name, those this process sweeps."""
        names = list(tenants)
        if not self.instance:
            return [tenant for tenant in names if self.holds(tenant)]
        leases = [self._leases.get(t) or self.ledger.lease(t, "sweep", 1) for t in names]
        holders = await asyncio.gather(*(lease.holder() for lease in leases))
        mine = f"{self.instance}/"
        return [
            t for t, holder in zip(names, holders, strict=True) if (holder or "").startswith(mine)
        ]

    @property
    def _ttl_ms(self) -> int:
        return round(self.ttl_s * 1000)

    async def release(self) -> None:
        """Give up every lease held (at shutdown), so another process takes over at its
        next round instead of after the ttl."""
        for tenant, lease in self._leases.items():
            if lease.held:
                try:
                    await lease.release()
                except Exception:
                    log.warning("sweep lease not released", extra={"tenant": tenant})
