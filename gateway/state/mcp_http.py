"""An MCP server at a Streamable HTTP URL, as gateway/state/mcp_upstream.py calls it:
the SDK's client for what needs a session (the first contact, which learns the
protocol version the server speaks; listing tools), and, once a modern version is
pinned, each `tools/call` as one POST on a pooled aiohttp session, stamped and read
as the SDK's client does.

Why two clients: the SDK's client runs on httpx2, whose connection pool cost a worker
2.0-3.0 ms of CPU per POST on this machine where aiohttp's cost 0.4-0.6 ms (the same
loopback server, 8 concurrent requests); a worker's calls are almost all
`tools/call`, and the upstream call was the largest part of its CPU per call."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Hashable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    encode_header_value,
)
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.edge.wire import Headers
from gateway.state.http_upstream import UPSTREAM_KEEPALIVE_S, upstream_session

CONNECT_TIMEOUT_S = 1.0
# Connections to one MCP server per worker (aiohttp's and httpx2's default).
MAX_CONNECTIONS = 100
# irrev's client of the tenant's servers, as a `tools/call` at a modern version names
# it; it answers no server requests (sampling, elicitation, roots): no capabilities.
CLIENT_INFO = {"name": "irrev", "version": "0.1.0"}
ACCEPT = "application/json, text/event-stream"
MAX_EVENT_BYTES = 1 << 20
# What a failed POST raises when it provably never reached the server: no connection
# could be made (refused, unresolvable, TLS refused, or none within the connect
# timeout). A request is written only on a connection that exists.
POST_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


class Reply(BaseModel):
    """A JSON-RPC message as a `tools/call`'s answer reads it: parsed once, straight
    into its result or error (any other message, a notification, has neither)."""

    model_config = ConfigDict(extra="ignore")

    id: int | str | None = None
    result: types.CallToolResult | None = None
    error: types.ErrorData | None = None

    @property
    def answers(self) -> bool:
        return self.result is not None or self.error is not None


def reply_of(body: bytes | str) -> Reply:
    """`body` parsed as a Reply; a body that is not JSON is the SDK's parse error, one
    that is JSON of another shape a ValidationError (ambiguous, as every failure)."""
    try:
        return Reply.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise MCPError(types.PARSE_ERROR, "the server's answer is not JSON") from exc
        raise


def raise_error(reply: Reply) -> None:
    """Raise the JSON-RPC error `reply` carries, if it carries one."""
    if reply.error is not None:
        raise MCPError(reply.error.code, reply.error.message, reply.error.data)


def result_of(reply: Reply) -> types.CallToolResult:
    raise_error(reply)
    if reply.result is None:
        raise MCPError(types.PARSE_ERROR, "the server's answer is not a JSON-RPC response")
    return reply.result


class _Body(httpx2.AsyncByteStream):
    """An aiohttp response's body as httpx2 reads a stream, for its event-stream parser."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.content.iter_any():
            yield chunk


async def events_of(response: aiohttp.ClientResponse) -> AsyncIterator[httpx2.ServerSentEvent]:
    """The server-sent events of `response`, parsed by httpx2's parser (the SDK's)."""
    request = httpx2.Request("POST", str(response.url))
    stream = httpx2.Response(
        response.status,
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
        stream=_Body(response),
        request=request,
    )
    async for event in httpx2.EventSource(stream, max_event_size=MAX_EVENT_BYTES):
        yield event


async def answer_of(response: aiohttp.ClientResponse, request_id: int) -> types.CallToolResult:
    """The result of request `request_id` in `response`, read as the SDK's Streamable
    HTTP transport reads one: a JSON body answering that id, or the first answer with
    that id in an event stream (its notifications skipped); a JSON-RPC error, or an
    HTTP refusal as the JSON-RPC error it carries or as the one the SDK makes of its
    status, raised as MCPError."""
    kind = response.headers.get("content-type", "").lower()
    status = response.status
    if status == 202 or 300 <= status < 400:
        raise MCPError(types.INVALID_REQUEST, f"the server answered HTTP {status}")
    if status >= 400:
        if kind.startswith("application/json"):
            refusal = Reply()  # a body that is no JSON-RPC error: the status's error
            with contextlib.suppress(ValidationError, MCPError):
                refusal = reply_of(await response.read())
            raise_error(refusal)
        # Without a session, a 404 is the HTTP spelling of "no such method" (the SDK's).
        code = types.METHOD_NOT_FOUND if status == 404 else types.INTERNAL_ERROR
        raise MCPError(code, f"the server answered HTTP {status}")
    if kind.startswith("application/json"):
        reply = reply_of(await response.read())
        # Not this call's answer (a server's mixed-up or stray reply): it says nothing
        # of this effect, whose fate stays unknown. A null id is allowed on an error,
        # the one a server gives a request it could not read (JSON-RPC 2.0, 5).
        if reply.id != request_id and not (reply.id is None and reply.error is not None):
            raise MCPError(types.INTERNAL_ERROR, f"the answer is to request {reply.id!r}")
        return result_of(reply)
    if kind.startswith("text/event-stream"):
        async for event in events_of(response):
            if event.event == "message" and event.data:
                reply = reply_of(event.data)
                if reply.answers and reply.id == request_id:
                    return result_of(reply)
        # No resumption: an answer that did not come is a lost one (ambiguous).
        raise MCPError(types.CONNECTION_CLOSED, "the event stream ended without an answer")
    raise MCPError(types.INVALID_REQUEST, f"unexpected content type {kind!r}")


@dataclass
class HttpConnection:
    """An MCP server at a Streamable HTTP URL: the SDK's client over one pooled httpx2
    client for sessions, one pooled aiohttp session for pinned `tools/call` POSTs
    (each made on first use, in the worker's event loop, with the tool's credentials
    as headers). The protocol version the server speaks is learnt on the first
    session (`auto`: one `server/discover` probe) and then pinned, so later requests
    are one POST each."""

    url: str
    credentials: Headers = field(default=(), repr=False)
    _client: httpx2.AsyncClient | None = field(default=None, repr=False)
    _posts: aiohttp.ClientSession | None = field(default=None, repr=False)
    _version: str = "auto"
    _ids: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    @property
    def config(self) -> Hashable:
        return (self.url, self.credentials)

    @property
    def where(self) -> str:
        return self.url

    def client(self) -> httpx2.AsyncClient:
        if self._client is None:
            self._client = httpx2.AsyncClient(
                headers=dict(self.credentials),
                timeout=httpx2.Timeout(30.0, connect=CONNECT_TIMEOUT_S),
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    def posts(self) -> aiohttp.ClientSession:
        """The session for pinned calls (upstream_session: what a forward's holds to),
        with the credentials on every request and a connect timeout on the socket
        alone: waiting for a pooled connection is bounded by the call's deadline."""
        if self._posts is None:
            self._posts = upstream_session(
                MAX_CONNECTIONS,
                UPSTREAM_KEEPALIVE_S,
                headers=dict(self.credentials),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
            )
        return self._posts

    @property
    def pinned(self) -> str:
        """The modern protocol version the server speaks, '' until learnt (or for a
        server of the handshake era, which gets a session per request)."""
        return self._version if self._version in MODERN_PROTOCOL_VERSIONS else ""

    async def call_tool(
        self, params: dict[str, Any], headers: Mapping[str, str], deadline: float
    ) -> types.CallToolResult:
        """One `tools/call` as one POST at the pinned version, no session: stamped as
        the SDK's client stamps a request of that version (`_meta` and the
        `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` headers, plus the tool's
        `Mcp-Param-*` `headers`); the answer read as JSON or as an event stream,
        whichever the server chose. Raises what failure_answer reads."""
        version = self.pinned
        meta = {
            **params.get("_meta", {}),
            PROTOCOL_VERSION_META_KEY: version,
            CLIENT_INFO_META_KEY: CLIENT_INFO,
            CLIENT_CAPABILITIES_META_KEY: {},
        }
        request_id = next(self._ids)
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {**params, "_meta": meta},
        }
        stamped = {
            "accept": ACCEPT,
            "content-type": "application/json",
            MCP_PROTOCOL_VERSION_HEADER: version,
            MCP_METHOD_HEADER: "tools/call",
            MCP_NAME_HEADER: encode_header_value(params["name"]),
            **headers,
        }
        content = json.dumps(message).encode()
        async with (
            asyncio.timeout(max(deadline - time.monotonic(), 0.0)),
            self.posts().post(
                self.url, data=content, headers=stamped, allow_redirects=False
            ) as response,
        ):
            return await answer_of(response, request_id)

    @asynccontextmanager
    async def open(self, deadline: float) -> AsyncIterator[Client]:
        transport = streamable_http_client(self.url, http_client=self.client())
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
            async with Client(transport, mode=self._version, cache=None) as session:
                if session.session.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    self._version = session.session.protocol_version
                yield session

    async def aclose(self) -> None:
        """Close both clients (their pooled connections); the next call opens others."""
        client, self._client = self._client, None
        posts, self._posts = self._posts, None
        if client is not None:
            await client.aclose()
        if posts is not None:
            await posts.close()
