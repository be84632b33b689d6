"""Group commit: a tenant's concurrent calls of one kind (reserves, posts) coalesced
into one script call (`Scripts.call_group`), which pays Redis's fixed cost per
command once for all of them and the client's packing and round trip once.

Only under concurrency: a call that finds none of its tenant's calls of its kind in
flight or waiting goes at once, alone, as it would without grouping. One that finds
one waits for the next group, which leaves when the call in flight ends, when
`wait_ms` has passed since the first of it waited (the gateway's IRREV_GROUP_WAIT_MS),
or when it is `max_items` long, whichever is first. Each call keeps what it has
alone: its own idempotency key, its own reply or error (one item's refusal is not its
neighbours'), and the order the calls arrived in, which is the order they run in. A
call cancelled while it waits (its client went away) leaves the group unsent; once
sent it runs, as a call cancelled in flight does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .errors import BadInput

Item = TypeVar("Item")
Result = TypeVar("Result")

MAX_WAIT_MS = 10.0
MAX_ITEMS = 256  # _lib.lua's MAX_GROUP


@dataclass
class _Lane(Generic[Item, Result]):
    """One tenant's calls of one kind: how many groups are in flight, and those
    waiting for the next."""

    in_flight: int = 0
    waiting: list[tuple[Item, asyncio.Future[Result]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Coalescer(Generic[Item, Result]):
    """Calls of one kind, grouped per tenant. `send(tenant, items)` runs a group and
    returns each item's result or its error, in order (a group of one is a call
    alone); an exception it raises is every item's. `sent(size)` is told the size of
    each group sent (1 for a call alone), for an operator to see whether groups form."""

    def __init__(
        self,
        send: Callable[[str, list[Item]], Awaitable[Sequence[Result | Exception]]],
        *,
        wait_ms: float,
        max_items: int = 64,
        sent: Callable[[int], None] | None = None,
    ) -> None:
        if not 0 < wait_ms <= MAX_WAIT_MS:
            raise BadInput("group_wait_ms", f"must be above 0 and at most {MAX_WAIT_MS:g}")
        if not 2 <= max_items <= MAX_ITEMS:
            raise BadInput("group_max", f"must be 2 to {MAX_ITEMS}")
        self._send = send
        self._sent = sent
        self._wait_s = wait_ms / 1000
        self._max_items = max_items
        self._lanes: dict[str, _Lane[Item, Result]] = {}
        self._groups: set[asyncio.Task[None]] = set()  # held until they end

    async def submit(self, tenant: str, item: Item) -> Result:
        lane = self._lanes.setdefault(tenant, _Lane())
        if not lane.in_flight and not lane.waiting:
            lane.in_flight += 1
            try:
                self._told(1)
                (result,) = await self._send(tenant, [item])
            finally:
                self._ended(tenant, lane)
            if isinstance(result, Exception):
                raise result
            return result
        waiter: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        entry = (item, waiter)
        lane.waiting.append(entry)
        if len(lane.waiting) >= self._max_items:
            self._flush(tenant, lane)
        elif lane.timer is None:
            lane.timer = asyncio.get_running_loop().call_later(
                self._wait_s, self._flush, tenant, lane
            )
        try:
            return await waiter
        except asyncio.CancelledError:
            if entry in lane.waiting:  # not sent yet: it never will be
                lane.waiting.remove(entry)
                self._ended(tenant, lane, finished=False)
            raise

    def _told(self, size: int) -> None:
        if self._sent is not None:
            self._sent(size)

    def _flush(self, tenant: str, lane: _Lane[Item, Result]) -> None:
        """The waiting calls (up to max_items) go as one group."""
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        group, lane.waiting = lane.waiting[: self._max_items], lane.waiting[self._max_items :]
        if lane.waiting:  # more than one group waited: the rest keep a timer
            lane.timer = asyncio.get_running_loop().call_later(
                self._wait_s, self._flush, tenant, lane
            )
        if not group:
            return
        lane.in_flight += 1
        self._told(len(group))
        task = asyncio.get_running_loop().create_task(self._run(tenant, lane, group))
        self._groups.add(task)
        task.add_done_callback(self._groups.discard)

    async def _run(
        self,
        tenant: str,
        lane: _Lane[Item, Result],
        group: list[tuple[Item, asyncio.Future[Result]]],
    ) -> None:
        try:
            results = await self._send(tenant, [item for item, _ in group])
        except asyncio.CancelledError:
            for _, waiter in group:
                waiter.cancel()
            raise
        except Exception as exc:
            for _, waiter in group:
                if not waiter.done():
                    waiter.set_exception(exc)
        else:
            for (_, waiter), result in zip(group, results, strict=True):
                if waiter.done():
                    continue
                if isinstance(result, Exception):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)
        finally:
            self._ended(tenant, lane)

    def _ended(self, tenant: str, lane: _Lane[Item, Result], *, finished: bool = True) -> None:
        """A group (`finished`) or a waiting call ended: the calls that waited for it
        go now, and a lane with nothing left is dropped (tenants come and go)."""
        if finished:
            lane.in_flight -= 1
            if lane.waiting:
                self._flush(tenant, lane)
        if not lane.in_flight and not lane.waiting:
            if lane.timer is not None:
                lane.timer.cancel()
                lane.timer = None
            if self._lanes.get(tenant) is lane:
                del self._lanes[tenant]
