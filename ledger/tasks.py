"""Stopping background tasks for good.

In Python 3.11, `asyncio.wait_for` can swallow a cancellation that races the end of
what it waits for (fixed in 3.12, where it is built on `asyncio.timeout`), and
redis-py awaits each socket write of a pipeline through it while a socket timeout is
set. A loop cancelled during such a write then runs on, and a shutdown that cancels
it once and awaits it waits forever: seen as a gateway's policy loop, cancelled in
the keys pipeline's write, that never stopped (tests/gateway/test_failover_epochs.py
hung in half its runs). So a task is cancelled again until it has ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

# How long a cancelled task has to end before it is cancelled again.
RECANCEL_S = 0.1


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended, cancelling again any that
    ran on past its cancellation. Then raise the first exception one ended with
    other than its cancellation, as awaiting it would have."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            task.result()
