"""stop_tasks: a task that runs on past its cancellation (as Python 3.11's
asyncio.wait_for lets one do when the cancel races the end of a socket write) is
cancelled again until it ends, where cancelling once and awaiting it waited forever."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ledger import stop_tasks

# Pure asyncio: no Redis server in it.
pytestmark = pytest.mark.server_neutral


async def swallows_one_cancellation(ended: list[str]) -> None:
    # What wait_for did with a cancel that raced the write it waited for.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(60)
    try:
        await asyncio.sleep(60)
    finally:
        ended.append("stopped")


async def test_a_task_that_swallows_its_cancellation_is_stopped_anyway() -> None:
    ended: list[str] = []
    task = asyncio.get_running_loop().create_task(swallows_one_cancellation(ended))
    await asyncio.sleep(0)  # it waits in its first sleep
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    assert not done  # one cancellation did not stop it
    await asyncio.wait_for(stop_tasks([task]), timeout=10)
    assert task.cancelled() and ended == ["stopped"]


async def test_a_task_that_failed_raises_its_failure_once_all_have_ended() -> None:
    async def fails() -> None:
        raise ValueError("its own failure")

    loop = asyncio.get_running_loop()
    failing, waiting = loop.create_task(fails()), loop.create_task(asyncio.sleep(60))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="its own failure"):
        await stop_tasks([failing, waiting])
    assert waiting.cancelled()
