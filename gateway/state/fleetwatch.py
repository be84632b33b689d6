"""The fleet's watcher: one process of the fleet (whichever holds the watch,
ledger/lease.py Watch) does the checks every process once did for itself, so that an
idle fleet's Redis load grows with its tenants, not with its processes:

- every CHECK_S it reads whether each tenant's sweep and webhook leases are held
  (one read of each) and announces 'lease' when one lapsed since its last look (its
  holder died): every process that serves the tenant asks for it at its next round
  (sweeper.py, webhooks.py). Processes no longer ask, each on its own, for the
  leases they do not hold.
- every `poll_s` it reads the policy, outcome and keys epochs and announces each that
  moved since its last look (a writer may have died between its bump and its
  announcement). Processes no longer read them unasked (tenants.py).
- every `full_read_s` it reads the version of every stored policy (its number and
  digest: after a failover that lost a version, the next write has its number) and
  of every tenant's managed keys, and bumps the policy (keys) epoch when one moved
  since its last look (a writer may have died between its write and its bump: hosts
  then read the records (keys) of their tenants). Processes no longer re-read every
  record.

The tenants are those with accounts in the ledger (Ledger.tenants): every tenant any
host of the fleet serves, whether or not this host does.

While it holds the watch it beats every BEAT_S (lua/watch.lua publishes 'beat'). A
process that hears beats (ChangeFeed.watched) leaves those checks to the watcher;
one that heard none for WATCH_LAPSE_S (or none yet, just started) asks for the
watch every BEAT_S, and polls for itself as before until a watcher beats again.
A new watcher's first look announces every kind and bumps the epoch: what its
predecessor may have been about to find."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from ledger import ChangeFeed, Ledger, LedgerError, stop_tasks

log = logging.getLogger("irrev.gateway")
# How often the watcher looks for lapsed leases: with a sweep lease's ttl (3 s) and a
# round, a dead holder's tenant is swept again within about 15 s.
CHECK_S = 10.0
BEAT_S = ChangeFeed.BEAT_S
# The watch outlives a beat or so late beyond WATCH_LAPSE_S, when the others ask.
WATCH_TTL_S = ChangeFeed.WATCH_LAPSE_S + BEAT_S


class FleetWatch:
    def __init__(
        self,
        ledger: Ledger,
        feed: ChangeFeed,
        poll_s: float,
        full_read_s: float,
        instance: str = "",
        check_s: float = CHECK_S,
    ) -> None:
        self.ledger = ledger
        self.feed = feed
        self.poll_s = poll_s
        self.full_read_s = full_read_s
        self.check_s = check_s
        holder = f"{instance}/{os.getpid()}" if instance else ""
        self.watch = ledger.watch(round(WATCH_TTL_S * 1000), holder=holder)
        self.holding = False
        # What the last look of this term saw (None: none yet), and when each look
        # is due next (monotonic).
        self._free: set[tuple[str, str]] | None = None
        self._epochs: tuple[int, ...] | None = None
        # Stored policy versions (number, digest) and managed keys versions, by tenant.
        self._versions: tuple[dict[str, tuple[int, str]], dict[str, int]] | None = None
        self._due = {"leases": 0.0, "epochs": 0.0, "versions": 0.0}
        self._failing: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        """Stop, and give the watch up if held: another process takes it once it
        hears no beat for WATCH_LAPSE_S, not WATCH_TTL_S later still."""
        if self._task is not None:
            await stop_tasks([self._task])
        if self.holding:
            with contextlib.suppress(LedgerError):
                await self.watch.release()
            self.holding = False

    async def _run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:
                # It runs unwatched for the process's life: whatever it meets, it
                # tries again at the next beat.
                log.exception("fleet watch failed; trying again")
            await asyncio.sleep(BEAT_S)

    async def round(self) -> None:
        """Beat and do the looks that are due, if this process holds the watch or
        hears no watcher beat (then it asks for the watch)."""
        # Not subscribed, it cannot tell whether a watcher beats: it polls for itself
        # (as every process does while unwatched), and leaves the watch to others.
        if not self.holding and (self.feed.watched or not self.feed.live):
            return
        try:
            held = await self.watch.beat()
        except LedgerError as exc:
            held = False
            self._failed("beat", exc)
        if held != self.holding:
            said = "fleet watch taken" if held else "fleet watch lost"
            log.info(said, extra={"pid": os.getpid()})
            self.holding = held
            self._free, self._epochs, self._versions = None, None, None
            self._due = dict.fromkeys(self._due, 0.0)
        if not held:
            return
        self._back("beat")
        looks = (
            ("leases", self.check_s, self._leases),
            ("epochs", self.poll_s, self._epochs_moved),
            ("versions", self.full_read_s, self._versions_moved),
        )
        for name, every_s, look in looks:
            now = time.monotonic()
            if now < self._due[name]:
                continue
            # Each look on its own, and rescheduled only once done: one that failed
            # is tried again at the next beat.
            try:
                await look()
            except LedgerError as exc:
                self._failed(name, exc)
            else:
                self._back(name)
                self._due[name] = now + every_s

    async def _leases(self) -> None:
        free = await self.ledger.free_leases(await self.ledger.tenants())
        # Only what lapsed since the last look: a lease that stays free (a tenant no
        # process serves, a tenant without a webhook) is not announced every look.
        if self._free is None or free - self._free:
            await self.ledger.policies.announce("lease")
        self._free = free

    async def _epochs_moved(self) -> None:
        epochs = (*await self.ledger.policies.epochs(), await self.ledger.keys.epoch())
        for i, kind in enumerate(("policy", "outcomes", "keys")):
            if self._epochs is None or epochs[i] != self._epochs[i]:
                await self.ledger.policies.announce(kind)
        self._epochs = epochs

    async def _versions_moved(self) -> None:
        tenants = await self.ledger.tenants()
        policies = await self.ledger.policies.versions(tenants)
        keys = await self.ledger.keys.versions(tenants)
        if self._versions is None or policies != self._versions[0]:
            await self.ledger.policies.bump()
        if self._versions is None or keys != self._versions[1]:
            await self.ledger.keys.bump()
        self._versions = (policies, keys)

    def _failed(self, look: str, exc: LedgerError) -> None:
        """Once per outage of each look, not at every beat."""
        if look not in self._failing:
            self._failing.add(look)
            log.warning("fleet watch: look failed", extra={"look": look, "why": str(exc)})

    def _back(self, look: str) -> None:
        if look in self._failing:
            self._failing.discard(look)
            log.info("fleet watch: look works again", extra={"look": look})
