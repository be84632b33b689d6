"""A cancellation that races a wakeup is never lost. In Python 3.11 `asyncio.wait_for`
returns its awaitable's result when the cancellation of the task waiting on it
arrives just after that awaitable finished, and the task goes on as if never
cancelled: a forward whose caller was cancelled (a worker's shutdown, a client gone)
was sent anyway once its tenant's upstream slot came free. `asyncio.timeout` lets
the cancellation through. No Redis: the race is the event loop's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.edge.wire import StoredRequest
from gateway.state.http_upstream import HttpTarget, HttpUpstream, UpstreamSlots, make_client

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"


@asynccontextmanager
async def counting_upstream() -> AsyncIterator[tuple[str, list[int]]]:
    """A tool API that answers every request 200 and counts the requests it got."""
    seen = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            seen[0] += 1
            writer.write(ANSWER)
            await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


def order() -> StoredRequest:
    return StoredRequest(
        agent="a",
        tool="t",
        method="POST",
        path="/orders",
        query="",
        content_type="application/json",
        body_b64="",
        route_id="r",
        price=1,
    )


async def test_a_forward_cancelled_as_its_slot_comes_free_is_not_sent() -> None:
    """The tenant's one slot is taken; a forward waits for it; the slot is released
    and, one loop turn later (the slot's handover done, its waiter not yet woken), the
    forward's task is cancelled. The forward must end cancelled, unsent, and leave the
    slot free."""
    async with counting_upstream() as (url, seen), make_client(1.0, 5.0, 4) as client:
        slots = UpstreamSlots(semaphore=asyncio.Semaphore(1), wait_s=5.0)
        upstream = HttpUpstream(client, HttpTarget(url), slots=slots)
        await slots.semaphore.acquire()
        task = asyncio.create_task(upstream.deliver(order(), "h1", time.monotonic() + 10))
        for _ in range(3):
            await asyncio.sleep(0)  # it waits for the slot
        assert not task.done()
        slots.semaphore.release()
        await asyncio.sleep(0)  # the slot is handed to the waiting forward
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done and task.cancelled(), f"the forward went on: {task}"
        assert seen == [0], "a cancelled forward reached the tool"
        assert not slots.semaphore.locked(), "the cancelled forward kept the slot"
