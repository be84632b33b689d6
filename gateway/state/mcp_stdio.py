"""A stdio MCP server that irrev runs itself (`tools.<name>.mcp_command`): the
`Connection` (gateway/state/mcp_upstream.py) of such a server.

Each gateway worker runs its own process of each such server, a child started with
the SDK's stdio client on first use, and keeps it running (gateway/state/supervision.py): a
process that exits, or cannot be started, is started again after a backoff that
doubles with each restart within the window; after the most restarts the window
allows, the server is left down until the oldest of them leaves it, and calls are
refused at once meanwhile. A worker that stops stops its processes (the SDK's
shutdown: stdin closed, then SIGTERM and SIGKILL to the process group); one that dies
closes their stdin, on which a stdio server exits.

What a call's fate is (contract 6): a call never handed to a live process was never
sent (`NotSent`, its hold released); one handed over whose process then exited
(`Lost`) or that timed out may have taken effect (ambiguous, charged). Why a call was
not sent, as `why`: `process_not_started` (the start it waited for failed),
`process_starting` (not started by its deadline), `process_restarting` (the next
start is due after its deadline), `process_restart_limit` (given up for now),
`process_stopped` (the policy changed or the worker is stopping)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType

import anyio
import mcp_types as types
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared._stream_protocols import ReadStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from gateway.state.mcp_upstream import Lost, NotSent, causes_of
from gateway.state.supervision import Supervision

log = logging.getLogger("irrev.gateway")


@dataclass(frozen=True)
class Command:
    """What runs: `argv` (no shell), the environment beyond the SDK's defaults (HOME,
    LOGNAME, PATH, SHELL, TERM, USER of the gateway's own), the working directory.
    `env` holds resolved secrets: never shown."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    cwd: str | None = None

    def parameters(self) -> StdioServerParameters:
        return StdioServerParameters(
            command=self.argv[0], args=list(self.argv[1:]), env=dict(self.env), cwd=self.cwd
        )


class _Watched:
    """A transport's read stream that says when it ended: the server closed its
    output, so it exited (or is exiting) and no answer can come any more."""

    def __init__(
        self, stream: ReadStream[SessionMessage | Exception], ended: asyncio.Event
    ) -> None:
        self._stream = stream
        self._ended = ended

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended.set()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self._stream.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._ended.set()
            raise

    async def aclose(self) -> None:
        self._ended.set()
        await self._stream.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched_stdio(
    parameters: StdioServerParameters, ended: asyncio.Event
) -> AsyncIterator[TransportStreams]:
    async with stdio_client(parameters) as (read, write):
        yield _Watched(read, ended), write


def _describe(exc: BaseException) -> str:
    """Why a start failed, for the log and the calls refused (never the environment)."""
    for cause in causes_of(exc):
        if isinstance(cause, OSError):
            return f"{cause.strerror or type(cause).__name__}: {cause.filename!r}"
        if isinstance(cause, MCPError) and cause.code == types.CONNECTION_CLOSED:
            return "it exited (or closed its standard output) before the MCP handshake ended"
    leaf = causes_of(exc)[0]
    return f"{type(leaf).__name__}: {leaf}"


@dataclass(eq=False)
class StdioConnection:
    """One stdio MCP server of one tenant in this worker: its process, started on
    first use and kept running by a task of its own (`_supervise`)."""

    command: Command
    name: str  # `<tenant>/<tool>`, as logs name the server
    supervision: Supervision = field(default_factory=Supervision)
    _client: Client | None = field(default=None, repr=False)
    _ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _failed_starts: int = 0
    _failure: str = ""
    _restart_at: float = 0.0
    _down_until: float = 0.0
    _restarts: deque[float] = field(default_factory=deque)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _scope: anyio.CancelScope | None = field(default=None, repr=False)
    _closed: bool = False

    @property
    def config(self) -> Hashable:
        return self.command

    @property
    def where(self) -> str:
        return f"{self.name} ({self.command.argv[0]})"

    @asynccontextmanager
    async def open(self, deadline: float) -> AsyncIterator[Client]:
        client, ended = await self._live(deadline)
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                yield client
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED and ended.is_set():
                raise Lost(
                    "process_exited", f"the stdio MCP server {self.name} exited during the call"
                ) from exc
            raise

    async def aclose(self) -> None:
        """Stop the process (if any) and refuse calls from now on."""
        self._closed = True
        self._notify()
        task, self._task = self._task, None
        if task is None:
            return
        if self._scope is not None:
            self._scope.cancel()
        # wait, not gather: a cancellation of this caller must not reach the task
        # natively, which would cut the SDK's shielded shutdown of the process short.
        await asyncio.wait({task})

    async def _live(self, deadline: float) -> tuple[Client, asyncio.Event]:
        """The live session, once there is one: the process started (on first use) or
        restarted in time; NotSent when there is none by `deadline`, or none can be."""
        if self._task is None and not self._closed:
            # A context of its own: not the request's that happened to start it (its
            # request id would be on every line the process's supervisor logs).
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._supervise(), context=contextvars.Context())
        failed = self._failed_starts
        while True:
            if self._closed:
                raise NotSent("process_stopped", f"the stdio MCP server {self.name} was stopped")
            if self._client is not None and not self._ended.is_set():
                return self._client, self._ended
            if self._failed_starts != failed:  # the start this call waited for
                raise NotSent(
                    "process_not_started",
                    f"the stdio MCP server {self.name} could not be started: {self._failure}",
                )
            now = time.monotonic()
            if self._down_until > now:
                raise NotSent("process_restart_limit", self._given_up(now))
            if self._restart_at > deadline:
                raise NotSent(
                    "process_restarting",
                    f"the stdio MCP server {self.name} restarts after this call's deadline",
                )
            changed = self._changed
            try:
                # Not wait_for, which in Python 3.11 can swallow a cancellation that
                # races the wakeup: a cancelled call then went on to the server.
                async with asyncio.timeout(max(deadline - now, 0.0)):
                    await changed.wait()
            except TimeoutError:
                raise NotSent(
                    "process_starting",
                    f"the stdio MCP server {self.name} had not started by this call's deadline",
                ) from None

    def _given_up(self, now: float) -> str:
        return (
            f"the stdio MCP server {self.name} ended again after {len(self._restarts)} "
            f"restarts within {self.supervision.window_s:g} s; it is started again in "
            f"{self._down_until - now:.0f} s, or when its policy changes"
        )

    def _notify(self) -> None:
        """Wake every call waiting for the process (it started, failed, or is down)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _supervise(self) -> None:
        """Run the process, and again each time it ends, until aclose cancels this."""
        with anyio.CancelScope() as scope:
            self._scope = scope
            while not self._closed:
                await self._run_once()
                await anyio.sleep(self._restart_delay())
                self._restarts.append(time.monotonic())
                self._restart_at = self._down_until = 0.0

    async def _run_once(self) -> None:
        """Start the process, keep its session live until the process ends; a start
        that fails counts as one (the calls waiting for it are refused)."""
        ended = asyncio.Event()
        transport = _watched_stdio(self.command.parameters(), ended)
        started = False
        # A scope around the whole session, not only its start: the SDK's task groups
        # opened by the start must close inside any scope that was open around them.
        limit = anyio.current_time() + self.supervision.start_timeout_s
        try:
            with anyio.CancelScope(deadline=limit) as start:
                async with Client(transport, mode="auto", cache=None) as client:
                    start.deadline = math.inf
                    started = True
                    self._client, self._ended = client, ended
                    self._notify()
                    log.info("MCP server started", extra={"server": self.where})
                    await ended.wait()
                    # Down before the SDK's shutdown, which may take seconds (SIGTERM,
                    # then SIGKILL): no call is handed to a process that has gone.
                    self._client = None
                    log.warning("MCP server exited", extra={"server": self.where})
            if start.cancelled_caught:
                limit_s = self.supervision.start_timeout_s
                self._start_failed(f"no MCP handshake within {limit_s:g} s")
        except Exception as exc:
            if not started:
                self._start_failed(_describe(exc))
            else:
                log.warning(
                    "MCP server's process did not stop cleanly",
                    extra={"server": self.where, "error": type(exc).__name__},
                )
        finally:
            self._client = None
            self._notify()

    def _start_failed(self, why: str) -> None:
        self._failed_starts += 1
        self._failure = why
        log.warning("MCP server could not start", extra={"server": self.where, "error": why})

    def _restart_delay(self) -> float:
        """How long until the next start: the backoff, or until the oldest restart
        leaves the window once `max_restarts` were made within it (the server is
        then down, and calls are refused at once)."""
        now = time.monotonic()
        rules = self.supervision
        while self._restarts and self._restarts[0] <= now - rules.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= rules.max_restarts:
            # With no restarts allowed at all, down for a window from now.
            self._down_until = (self._restarts[0] if self._restarts else now) + rules.window_s
            log.error("MCP server down", extra={"server": self.where, "why": self._given_up(now)})
            self._notify()
            return self._down_until - now
        delay = min(rules.backoff_s * 2 ** len(self._restarts), rules.backoff_max_s)
        self._restart_at = now + delay
        self._notify()
        return delay
