"""`Upstream` over MCP: an admitted effect is one `tools/call` to the tenant's MCP server
(over a `Connection`: Streamable HTTP here, stdio in gateway/state/mcp_stdio.py; the
official SDK's client, or, once an HTTP server's modern version is known, one POST
on a pooled client, stamped and read as the SDK's client does), with the hold's
idempotency key in the request's `_meta` so that a deduplicating server can
recognise a repeat.

What a result means for the hold (docs/policy.md, "MCP servers"): a result posts; a
result with `isError` voids only where the route says such errors mean "not
executed", and is otherwise ambiguous (still charged); a JSON-RPC "method not found"
voids; a connection that never opened, or a call never handed to a live server
process, voids (nothing was sent); a timeout, a reset, a server process that exited
mid-call or any other error is ambiguous. The answer the agent gets is the
`CallToolResult` as JSON, so a repeat of the key gets the very result back from the
settled hold."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Hashable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import find_invalid_x_mcp_header, mcp_param_headers, x_mcp_header_map

from gateway.edge.wire import StoredRequest, upstream_key
from gateway.pipeline.upstream import Answer, Fate
from gateway.state.mcp_http import POST_NOT_SENT, HttpConnection

# Where an agent puts its idempotency key, and where irrev puts the hold's key for the
# MCP server: a `_meta` key under irrev's own prefix, as the MCP specification asks
# of extensions (`io.modelcontextprotocol/` is reserved).
IRREV_META_PREFIX = "dev.irrev/"
KEY_META = "dev.irrev/idempotency_key"
# The agent's key as the messages that ask for it say: it travels in _meta, not a header.
MCP_KEY = f"_meta {KEY_META!r}"
HOLD_META = "dev.irrev/hold"
# What every answer's payload is: a CallToolResult, or a JSON-RPC error refusing it.
JSON = "application/json"
# JSON-RPC errors by which a server refuses a call before running it.
# Only "no such method" proves the tool did not run: SDK servers (TypeScript's McpServer)
# answer -32602 / -32600 also *after* the tool ran, when its output fails its schema.
NOT_ACCEPTED = frozenset({types.METHOD_NOT_FOUND})
MAX_PAGES = 100
log = logging.getLogger("irrev.gateway")


def result_answer(result: types.CallToolResult, fate: Fate, why: str = "") -> Answer:
    """The result as the agent gets it (and a repeat of the key reads it back), without
    `_meta` keys under irrev's prefix: only irrev speaks as irrev (holds, prices,
    keys); the server's own keys pass."""
    if result.meta:
        own = {k: v for k, v in result.meta.items() if not k.startswith(IRREV_META_PREFIX)}
        result = result.model_copy(update={"meta": own or None})
    body = result.model_dump_json(by_alias=True, exclude_none=True).encode()
    return Answer(fate=fate, payload=body, media_type=JSON, why=why, parsed=result)


class NotSent(Exception):
    """The call provably never reached the server: no live process of a stdio server
    to hand it to (not started, restarting, given up). `why` is a reason code."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(detail)
        self.why = why


class Lost(Exception):
    """The call was handed to the server and its answer can no longer come (its
    process exited): it may have taken effect. `why` is a reason code."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(detail)
        self.why = why


def causes_of(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of an ExceptionGroup (the SDK's task groups raise them)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in causes_of(inner)]
    return [exc]


def failure_answer(exc: BaseException) -> Answer:
    """What an exception of the SDK's client, or of a pinned POST, says about the
    effect."""
    causes = causes_of(exc)
    never_reached = (httpx2.ConnectError, httpx2.ConnectTimeout, *POST_NOT_SENT)
    if causes and all(isinstance(c, never_reached) for c in causes):
        return Answer(fate=Fate.NOT_SENT, why="upstream_refused")
    not_sent = [c for c in causes if isinstance(c, NotSent)]
    if causes and len(not_sent) == len(causes):
        return Answer(fate=Fate.NOT_SENT, why=not_sent[0].why)
    for cause in causes:
        if isinstance(cause, Lost):
            return Answer(fate=Fate.UNKNOWN, why=cause.why)
        if isinstance(cause, MCPError):
            error = {"code": cause.code, "message": cause.error.message}
            body = json.dumps({"error": error}).encode()
            fate = Fate.REFUSED if cause.code in NOT_ACCEPTED else Fate.UNKNOWN
            return Answer(fate=fate, payload=body, media_type=JSON, why=f"mcp_{cause.code}")
        if isinstance(cause, TimeoutError | httpx2.TimeoutException):
            return Answer(fate=Fate.UNKNOWN, why="upstream_timeout")
    return Answer(fate=Fate.UNKNOWN, why="upstream_reset")


class Connection(Protocol):
    """How an MCP server is reached: `open` gives a session ready for requests, bounded
    by `deadline` (a `time.monotonic()` instant), and raises what failure_answer
    reads; `config` is what makes two connections the same server."""

    @property
    def config(self) -> Hashable: ...

    @property
    def where(self) -> str:
        """The server as logs name it (never with its credentials)."""
        ...

    def open(self, deadline: float) -> AbstractAsyncContextManager[Client]: ...

    async def aclose(self) -> None: ...


@dataclass
class McpUpstream:
    """One MCP server of one tenant, as the admission pipeline calls it, over its
    `connection`; `not_executed` are the MCP tools whose `isError` voids; `dedupes`
    says the server makes one effect per key (the tool's `dedupes`), so a repeat of
    an ambiguous call may be sent again."""

    connection: Connection
    not_executed: frozenset[str] = frozenset()
    dedupes: bool = False
    _tools: list[types.Tool] = field(default_factory=list)
    _tools_until: float = 0.0
    _by_name: dict[str, types.Tool] = field(default_factory=dict)
    _header_maps: dict[str, dict[tuple[str, ...], str]] = field(default_factory=dict)
    # Requests in progress through this server, so that a retired one closes once
    # they end rather than after the longest any could take.
    _busy: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()

    @property
    def resends(self) -> bool:
        return self.dedupes

    @property
    def key_name(self) -> str:
        return MCP_KEY

    def same_server(self, other: McpUpstream) -> bool:
        """Whether `other` is configured as this one (a reload kept it unchanged)."""
        return (self.connection.config, self.not_executed, self.dedupes) == (
            other.connection.config,
            other.not_executed,
            other.dedupes,
        )

    async def aclose(self) -> None:
        """Close the connection (an HTTP client's pool; a stdio server's process)."""
        await self.connection.aclose()

    async def retire(self, grace_s: float) -> None:
        """Close once the requests begun through this server have ended, or after
        `grace_s` (by when every delivery has given up: fire() gives one at most
        upstream_timeout_s); at once if cancelled (at shutdown)."""
        try:
            # Not wait_for, which in Python 3.11 can swallow a cancellation that races
            # the wakeup: a cancelled retire then waited out the rest of its grace.
            async with asyncio.timeout(grace_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        finally:
            # A shutdown cancels a retire again every 0.1 s until it ends (Upstreams.
            # aclose: ledger.stop_tasks), and a stdio server's process can take
            # seconds to stop: the close is waited for to its end all the same, or the
            # process outlived the shutdown.
            closing = asyncio.ensure_future(self.aclose())
            while not closing.done():
                with suppress(asyncio.CancelledError):
                    await asyncio.wait({closing})
            closing.result()

    @asynccontextmanager
    async def _session(self, deadline: float) -> AsyncIterator[Client]:
        self._busy += 1
        self._idle.clear()
        try:
            async with self.connection.open(deadline) as session:
                yield session
        finally:
            self._done()

    def _done(self) -> None:
        self._busy -= 1
        if not self._busy:
            self._idle.set()

    def _param_headers(self, name: str, arguments: Mapping[str, Any]) -> dict[str, str]:
        """The `Mcp-Param-*` headers the tool's listed input schema declares (as the
        SDK's client sends them); none for a tool never listed."""
        header_map = self._header_maps.get(name)
        return mcp_param_headers(header_map, arguments) if header_map else {}

    def listed(self, name: str) -> types.Tool | None:
        """The tool `name` as the server last listed it (however long ago); None if it
        was never listed."""
        return self._by_name.get(name)

    async def list_tools(self, deadline: float, ttl_s: float) -> list[types.Tool]:
        """The server's tools, every page, kept for `ttl_s` (a fleet lists often); an
        empty list while the server cannot be reached (its tools cannot be called
        either)."""
        if time.monotonic() < self._tools_until:
            return self._tools
        tools: list[types.Tool] = []
        try:
            async with self._session(deadline) as session:
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await session.list_tools(cursor=cursor)
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as exc:
            log.warning(
                "MCP server did not list its tools",
                extra={"server": self.connection.where, "error": type(exc).__name__},
            )
            return []
        self._tools, self._tools_until = tools, time.monotonic() + ttl_s
        self._by_name = {tool.name: tool for tool in tools}
        self._header_maps = {
            tool.name: x_mcp_header_map(tool.input_schema)
            for tool in tools
            if find_invalid_x_mcp_header(tool.input_schema) is None
        }
        return tools

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any],
        meta: types.RequestParamsMeta,
        deadline: float,
    ) -> types.CallToolResult:
        """One `tools/call`; raises what the SDK and the connection raise (see
        failure_answer)."""
        connection = self.connection
        if isinstance(connection, HttpConnection) and connection.pinned:
            params = {"name": name, "arguments": dict(arguments), "_meta": dict(meta)}
            headers = self._param_headers(name, arguments)
            self._busy += 1
            self._idle.clear()
            try:
                return await connection.call_tool(params, headers, deadline)
            finally:
                self._done()
        async with self._session(deadline) as session:
            # Sent as a bare request: ClientSession.call_tool would list the tools
            # after a result to check it against the output schema, a second
            # request that could fail after the effect was made. irrev passes the
            # result on; the agent's own client checks it.
            request = types.CallToolRequest(
                params=types.CallToolRequestParams(name=name, arguments=dict(arguments), _meta=meta)
            )
            return await session.session.send_request(request, types.CallToolResult)

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        """The `Upstream` protocol (gateway/pipeline/upstream.py): the effect's arguments (as
        priced) to its tool, under the hold's key; never raises for what the server
        does. MCP has no "still in progress" answer, so `retry` changes nothing."""
        tool = effect.path.removeprefix("/")
        arguments = json.loads(effect.body) if effect.body else {}
        meta: types.RequestParamsMeta = {}
        if hold_id:
            meta = {KEY_META: upstream_key(hold_id), HOLD_META: hold_id}  # type: ignore[misc]
        try:
            result = await self.call(tool, arguments, meta, deadline)
        except Exception as exc:  # every failure is a fate; ExceptionGroup is one too
            return failure_answer(exc)
        if not result.is_error:
            return result_answer(result, Fate.DELIVERED)
        if tool in self.not_executed:
            return result_answer(result, Fate.REFUSED, "mcp_not_executed")
        return result_answer(result, Fate.UNKNOWN, "mcp_is_error")

    async def lookup(self, tool: str, key: str, deadline: float) -> bool | None:
        """The reconciler's question (a route's `lookup: CALL <server>/<tool>`): was an
        effect made under `key`? True or False only from a result whose structured
        content says `{"found": true|false}`; None when the server cannot tell."""
        try:
            result = await self.call(tool, {"idempotency_key": key}, {}, deadline)
        except Exception:  # cannot tell
            return None
        found = result.structured_content
        if result.is_error or not isinstance(found, dict):
            return None
        value = found.get("found")
        return value if isinstance(value, bool) else None

    async def reconciled(self, tool: str, hold_id: str, deadline: float) -> Answer | None:
        """The lookup contract's answer (docs/policy.md) from the route's lookup tool:
        delivered (it took effect) or refused (it never did), as a tool result so that
        an agent repeating the key gets one; None (the hold stays charged) if it
        cannot tell."""
        found = await self.lookup(tool, upstream_key(hold_id), deadline)
        if found is None:
            return None
        said = "took effect" if found else "never took effect"
        text = (
            f"irrev reconciled this call: the MCP server's {tool} says it {said} "
            "(its own result was not recorded)."
        )
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content={"found": found, "lookup": tool},
        )
        return result_answer(result, Fate.DELIVERED if found else Fate.REFUSED)
