"""The loops a worker runs in the background while it serves: a job every so often,
the policy refresh (at once when told of a change), and the read of the fleet's
release flag during a rolling upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ledger import Ledger

log = logging.getLogger("irrev.gateway")
# How often the policy loop looks at the policy files' sizes and times between
# refreshes: an edit is taken in within this, not within the refresh interval.
FILE_LOOK_S = 0.25
# How often a worker reads the fleet's release flag while a rolling upgrade is on.
RELEASE_CHECK_S = 5.0


async def every(interval_s: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await work()
        except Exception:
            log.exception(f"{what} failed; retrying in {interval_s} s")


async def until_upgraded(ledger: Ledger) -> None:
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


async def policy_loop(
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
