"""`/mcp`, mounted without importing the MCP SDK: it loads (about 2 s of a worker's
start-up on a busy machine) and its transport starts on the first request, so a
gateway whose tenants have no MCP server starts as fast as before."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from gateway.routes.mcp_server import McpEndpoint


class LazyMcp:
    """The ASGI app at `/mcp`; `aclose` (at shutdown) stops the transport it started."""

    def __init__(self) -> None:
        self._endpoint: McpEndpoint | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._endpoint is None:
            async with self._lock:
                if self._endpoint is None:
                    self._endpoint = await self._start()
        await self._endpoint(scope, receive, send)

    async def _start(self) -> McpEndpoint:
        from gateway.routes.mcp_server import McpEndpoint, build

        answers, streams = build()
        started = asyncio.Event()
        # The transports' task groups live as long as the worker, in a task of their
        # own (as they would in a lifespan); requests start their work in them.
        self._task = asyncio.create_task(self._run((answers, streams), started))
        await started.wait()
        return McpEndpoint(answers, streams)

    async def _run(
        self, managers: tuple[StreamableHTTPSessionManager, ...], started: asyncio.Event
    ) -> None:
        async with managers[0].run(), managers[1].run():
            started.set()
            await self._stop.wait()

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
