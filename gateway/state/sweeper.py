"""One sweeper per tenant across the fleet: each gateway process tries for a
tenant's sweep lease (Ledger.lease) and sweeps only the tenants whose lease it
holds. The holder renews its lease every round. A process that lost the race asks
again only when told a lease may be free ('lease' on the change feed: a process gave
its leases up, or the fleet's watcher found one lapsed, gateway/state/fleetwatch.py), so an
idle fleet's Redis load is O(tenants) sweeps and renewals per interval, whatever the
number of processes. While no watcher beats (ChangeFeed.watched), it asks every
ASK_TTLS lease ttls instead (jittered, so the fleet's asks spread), as it did
before there was a watcher.

A holder that stops (crash, SIGKILL) leaves its tenants unswept until the lease
lapses and the watcher's next look finds it: at most a ttl plus fleetwatch.CHECK_S
plus a round, about 14 s by default (also if the holder was the watcher: another
process takes the watch within WATCH_TTL_S plus a beat of the last beat, ~10 s, and
looks at once). One that shuts down releases its leases and announces it (pub/sub,
ledger/changes.py), so the others ask at their next round. Sweeping is a safety net
(holds past their deadline are also settled by their own scripts when next touched),
so such a pause costs freshness, not correctness. Two holders for a round (a paused
holder whose lease lapsed) are harmless: what a sweep settles it decides on Redis
time inside its script."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Iterable

from gateway.edge import metrics
from gateway.state.margins import release_margins
from ledger import ChangeFeed, Lease, Ledger, LedgerError, archive_settled

log = logging.getLogger("irrev.gateway")
SWEEP_BATCH = 200
# A lease outlives this many sweep intervals, so a holder's late round does not lose it.
LEASE_INTERVALS = 3
MIN_LEASE_S = 3.0
# While no watcher beats, a process that does not hold a tenant's lease asks again
# after this many ttls.
ASK_TTLS = 10
# How often a tenant's risk-factor accounts are scanned for idle ones to close.
CLOSE_INTERVAL_S = 60.0
# Archive passes (ledger/archive.py) per tenant per round at most: a round renews every
# lease it holds, so a backlog of settled holds is taken a few hundred at a time.
ARCHIVE_PASSES = 5


class Sweeper:
    """`instance` names this gateway (all the workers of one `irrev serve`): its
    leases' tokens start with it, so any of its workers can tell which tenants its
    gateway sweeps (and reports the fleet gauges of)."""

    def __init__(
        self,
        ledger: Ledger,
        interval_s: float,
        instance: str = "",
        feed: ChangeFeed | None = None,
        close_interval_s: float = CLOSE_INTERVAL_S,
        archive_after_s: float | None = None,
    ) -> None:
        self.ledger = ledger
        # None: settled holds stay in their tenant's slot for their retention.
        self.archive_after_ms = None if archive_after_s is None else int(archive_after_s * 1000)
        self.close_interval_s = close_interval_s
        # Per tenant: where its scan for idle risk-factor accounts goes on, and when.
        self._close_at: dict[str, tuple[int, float]] = {}
        self.ttl_s = max(LEASE_INTERVALS * interval_s, MIN_LEASE_S)
        self.instance = instance
        self.feed = feed
        self._leases: dict[str, Lease] = {}
        self._next_ask: dict[str, float] = {}
        self._heard = 0
        self._sweeps = _Outages("sweep failed; tried again every round", "sweep back")
        # An absent gauge series reads as a quiet tenant: with its lease unreadable, no
        # gateway of the fleet may be reporting it.
        self._reports = _Outages(
            "fleet gauges not reported: the tenant's sweep lease cannot be read or taken; "
            "tried again every scrape",
            "fleet gauges reported again",
        )

    def holds(self, tenant: str) -> bool:
        """Whether this process is surely the tenant's sweeper now (also: whoever
        does the tenant's other once-per-fleet work)."""
        lease = self._leases.get(tenant)
        return lease is not None and lease.held

    async def round(self, tenants: Iterable[str]) -> int:
        """Sweep every tenant whose lease this process holds or can take; the number
        swept."""
        if self.feed is not None and self.feed.heard("lease") != self._heard:
            # Another process gave its leases up (or the feed may have missed that).
            self._heard = self.feed.heard("lease")
            self._next_ask.clear()
        swept = 0
        # At most one tenant's page of idle accounts a round: a round renews every
        # lease it holds, and must stay well inside a lease's ttl however many tenants.
        closing = False
        for tenant in tenants:
            # Each tenant on its own: one whose lease or sweep fails (its cluster
            # shard down) stopped the round, and every tenant after it went unswept
            # with its lease lapsing to another process.
            try:
                if await self._lease(tenant):
                    await self.ledger.sweep(tenant, batch=SWEEP_BATCH)
                    await release_margins(self.ledger, tenant)
                    metrics.SWEEPS.labels(tenant).inc()
                    swept += 1
                    if not closing and await self._close_idle(tenant):
                        closing = True
                    await self._archive(tenant)
            except Exception as exc:
                self._sweeps.failed(tenant, exc)
            else:
                self._sweeps.back(tenant)
        return swept

    async def _archive(self, tenant: str) -> None:
        """Settled holds of the tenant out of its slot, a few passes a round (none while
        an older release may serve: archive_settled)."""
        if self.archive_after_ms is None:
            return
        for _ in range(ARCHIVE_PASSES):
            done = await archive_settled(self.ledger, tenant, after_ms=self.archive_after_ms)
            if done.archived:
                metrics.HOLDS_ARCHIVED.labels(tenant).inc(done.archived)
            if not done.more:
                return

    async def _close_idle(self, tenant: str) -> bool:
        """A page of the tenant's idle risk-factor accounts closed (Ledger.
        close_idle_accounts), a scan of them all about every close interval: an agent
        paying many new payees leaves no account per payee past its window. Whether
        a page was read (False: not due)."""
        cursor, due = self._close_at.get(tenant, (0, 0.0))
        now = time.monotonic()
        if now < due:
            return False
        cursor, closed = await self.ledger.close_idle_accounts(tenant, cursor)
        if closed:
            metrics.ACCOUNTS_CLOSED.labels(tenant).inc(closed)
        # A scan that is not over goes on next round; a finished one waits.
        self._close_at[tenant] = (cursor, now if cursor else now + self.close_interval_s)
        return True

    def _lease_of(self, tenant: str) -> Lease:
        lease = self._leases.get(tenant)
        if lease is None:
            holder = f"{self.instance}/{os.getpid()}" if self.instance else ""
            lease = self.ledger.lease(tenant, "sweep", self._ttl_ms, holder=holder)
            self._leases[tenant] = lease
        return lease

    async def _lease(self, tenant: str) -> bool:
        lease = self._lease_of(tenant)
        now = time.monotonic()
        # Lost before, and not told since that a lease may be free: while a watcher
        # beats, that is all there is to know; else ask every ASK_TTLS ttls.
        lost = not lease.held and tenant in self._next_ask
        if lost and (self._watched() or now < self._next_ask[tenant]):
            return False
        if await lease.hold():
            self._next_ask.pop(tenant, None)
            return True
        self._next_ask[tenant] = now + ASK_TTLS * self.ttl_s * random.uniform(0.5, 1.0)
        return False

    def _watched(self) -> bool:
        return self.feed is not None and self.feed.watched

    async def reporting(self, tenants: Iterable[str]) -> list[str]:
        """The `tenants` whose fleet gauges this gateway reports: those one of its
        workers sweeps (one gateway of the fleet per tenant), or, for a gateway with
        no instance name, those this process sweeps. A tenant whose lease nobody holds
        (no sweep round has taken it yet, or it lapsed while its holder's loop was held
        up on a loaded machine) is taken now by this process, which sweeps it from its
        next round: else no gateway of the fleet reported its gauges until a round
        took it again."""
        names = list(tenants)
        leases = [self._lease_of(tenant) for tenant in names]
        # Each tenant on its own, as in `round`: one whose lease cannot be read or taken
        # (its shard down; Redis at maxmemory refuses the take's SET while renewals
        # pass) goes unreported, and the others are still reported.
        holders = await asyncio.gather(
            *(lease.holder() for lease in leases), return_exceptions=True
        )
        free = [i for i, holder in enumerate(holders) if holder is None]
        taken = await asyncio.gather(*(leases[i].hold() for i in free), return_exceptions=True)
        ours = {i: held is True for i, held in zip(free, taken, strict=True)}
        mine = f"{self.instance}/"
        for i, holder in enumerate(holders):
            if isinstance(holder, str):
                ours[i] = holder.startswith(mine) if self.instance else leases[i].held
        outcomes = dict(enumerate(holders)) | dict(zip(free, taken, strict=True))
        for i, tenant in enumerate(names):
            outcome = outcomes[i]
            if isinstance(outcome, BaseException):
                self._reports.failed(tenant, outcome)
            else:
                self._reports.back(tenant)
        return [tenant for i, tenant in enumerate(names) if ours.get(i, False)]

    @property
    def _ttl_ms(self) -> int:
        return round(self.ttl_s * 1000)

    async def release(self) -> None:
        """Give up every lease held (at shutdown) and announce it, so another process
        takes over at its next round instead of after the ttl and its next ask."""
        released = False
        for tenant, lease in self._leases.items():
            if lease.held:
                try:
                    released = await lease.release() or released
                except Exception:
                    log.warning("sweep lease not released", extra={"tenant": tenant})
        if released:
            with contextlib.suppress(LedgerError):
                await self.ledger.policies.announce("lease")


class _Outages:
    """Says once per outage that a tenant's periodic work fails (it is tried again
    every round or scrape: a line each time was a line every interval for the whole
    outage), and when it works again, after how long."""

    def __init__(self, failing: str, back: str) -> None:
        self.failing, self.back_again = failing, back
        self._since: dict[str, float] = {}  # monotonic

    def failed(self, tenant: str, exc: BaseException) -> None:
        if tenant not in self._since:
            self._since[tenant] = time.monotonic()
            log.warning(
                self.failing, extra={"tenant": tenant, "why": f"{type(exc).__name__}: {exc}"}
            )

    def back(self, tenant: str) -> None:
        since = self._since.pop(tenant, None)
        if since is not None:
            down_s = round(time.monotonic() - since, 1)
            log.info(self.back_again, extra={"tenant": tenant, "down_s": down_s})
