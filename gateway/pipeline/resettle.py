"""Settlements written later: an effect's fate is known (the tool answered) but the
ledger could not record it then (Redis unreachable, the tenant's cluster slot moving
past IRREV_MIGRATION_WAIT_S). The hold stays charged meanwhile, so nothing is ever
released early; but left alone it would stay pending until its deadline, then
ambiguous until the reconciler asked the tool. Here the same write is tried again in
the background, with growing pauses, for up to RESETTLE_S: the gateway's own retries
leave no hold pending whose outcome it knew. A process that stops first leaves it to
the reconciler, as before."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ledger import LedgerUnavailable, stop_tasks

log = logging.getLogger("irrev.gateway")

# How long a settlement is tried again; past it the reconciler settles the hold.
RESETTLE_S = 300.0
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 5.0


class Resettler:
    """One per worker: its settlements waiting for the ledger, each a task."""

    def __init__(self, within_s: float = RESETTLE_S) -> None:
        self.within_s = within_s
        self._tasks: set[asyncio.Task[None]] = set()

    def later(self, hold_id: str, operation: str, write: Callable[[], Awaitable[Any]]) -> None:
        """Try `write` (the settlement that failed) again until it is written."""
        task = asyncio.create_task(self._again(hold_id, operation, write))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _again(
        self, hold_id: str, operation: str, write: Callable[[], Awaitable[Any]]
    ) -> None:
        deadline = time.monotonic() + self.within_s
        pause = FIRST_PAUSE_S
        while time.monotonic() + pause < deadline:
            await asyncio.sleep(pause)
            try:
                await write()
            except LedgerUnavailable:
                pause = min(pause * 2, LONGEST_PAUSE_S)
                continue
            except Exception:
                log.exception("settlement refused when tried again", extra={"hold_id": hold_id})
                return
            log.info("settled later", extra={"hold_id": hold_id, "operation": operation})
            return
        log.warning(
            "settlement not written; the reconciler settles the hold",
            extra={"hold_id": hold_id, "operation": operation, "within_s": self.within_s},
        )

    async def aclose(self) -> None:
        await stop_tasks(list(self._tasks))
