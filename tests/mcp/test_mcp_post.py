"""A `tools/call` to a server whose modern version is pinned is one POST on the pooled
session (gateway/state/mcp_http.py, HttpConnection.call_tool): against the SDK's own
Streamable HTTP server answering as JSON and as an event stream, served on loopback by
uvicorn in the test's loop; the HTTP refusals the SDK's transport turns into JSON-RPC
errors, read as the same fates (a 404 refuses, a 500 or a stream without an answer is
ambiguous); and a port nobody listens on, which is "not sent"."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.edge.wire import StoredRequest
from gateway.pipeline.upstream import Fate
from gateway.state.mcp_http import HttpConnection
from gateway.state.mcp_upstream import HOLD_META, KEY_META, McpUpstream

SCHEMA = {
    "type": "object",
    "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
}
seen: list[dict[str, Any]] = []


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema=SCHEMA)])


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    assert ctx.request is not None
    headers = dict(ctx.request.headers)
    seen.append({"meta": dict(params.meta or {}), "headers": headers})
    text = json.dumps(params.arguments)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """`app` on a loopback port, in this loop; its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def sdk_server(json_response: bool) -> AsyncIterator[HttpConnection]:
    server: Server[Any] = Server("echo", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(app=server, json_response=json_response, stateless=True)
    async with manager.run(), serving(StreamableHTTPASGIApp(manager)) as url:
        connection = HttpConnection(url, credentials=(("authorization", "Bearer tool-secret"),))
        try:
            yield connection
        finally:
            await connection.aclose()


def effect(arguments: dict[str, Any]) -> StoredRequest:
    body = base64.b64encode(json.dumps(arguments).encode()).decode()
    return StoredRequest(
        agent="agent",
        tool="echo",
        method="CALL",
        path="/echo",
        query="",
        content_type="application/json",
        body_b64=body,
        route_id="r",
        price=1,
    )


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "event-stream"])
async def test_a_pinned_call_is_one_post_read_as_json_or_as_an_event_stream(
    json_response: bool,
) -> None:
    seen.clear()
    async with sdk_server(json_response) as connection:
        upstream = McpUpstream(connection)
        deadline = time.monotonic() + 5
        await upstream.list_tools(deadline, 60.0)  # learns and pins the version
        assert connection.pinned
        answer = await upstream.deliver(effect({"region": "eu-west", "n": 1}), "h-1", deadline)
    assert answer.fate is Fate.DELIVERED, answer
    result = types.CallToolResult.model_validate_json(answer.payload)
    block = result.content[0]
    assert isinstance(block, types.TextContent), block
    assert json.loads(block.text) == {"region": "eu-west", "n": 1}
    call = seen[-1]
    assert call["meta"][HOLD_META] == "h-1" and call["meta"][KEY_META]
    assert call["headers"]["authorization"] == "Bearer tool-secret"
    assert call["headers"]["mcp-method"] == "tools/call"
    assert call["headers"]["mcp-name"] == "echo"
    # The tool's schema declares the header: mirrored from the cached listing.
    assert call["headers"]["mcp-param-region"] == "eu-west"


def replying(status: int, kind: str, body: bytes) -> ASGIApp:
    async def reply(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", kind.encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return reply


def stream_of(*messages: dict[str, Any]) -> bytes:
    return b"".join(f"event: message\ndata: {json.dumps(m)}\n\n".encode() for m in messages)


RESULT = {"content": [{"type": "text", "text": "done"}]}
PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}


@pytest.mark.parametrize(
    ("status", "kind", "body", "fate", "why"),
    [
        (
            200,
            "text/event-stream",
            stream_of(PROGRESS, {"jsonrpc": "2.0", "id": 0, "result": RESULT}),
            Fate.DELIVERED,
            "",
        ),
        (200, "text/event-stream", stream_of(PROGRESS), Fate.UNKNOWN, "mcp_-32000"),
        (200, "application/json", b"not json", Fate.UNKNOWN, "mcp_-32700"),
        (
            200,
            "application/json",
            json.dumps({"jsonrpc": "2.0", "id": 0, "result": RESULT}).encode(),
            Fate.DELIVERED,
            "",
        ),
        # The answer to another request (a server's stray or mixed-up reply) says
        # nothing of this call's: the effect may have been made, or not.
        (
            200,
            "application/json",
            json.dumps({"jsonrpc": "2.0", "id": 7, "result": RESULT}).encode(),
            Fate.UNKNOWN,
            "mcp_-32603",
        ),
        (
            200,
            "application/json",
            json.dumps(
                {"jsonrpc": "2.0", "id": 7, "error": {"code": -32601, "message": "no"}}
            ).encode(),
            Fate.UNKNOWN,
            "mcp_-32603",
        ),
        (404, "text/plain", b"", Fate.REFUSED, "mcp_-32601"),
        (500, "text/plain", b"", Fate.UNKNOWN, "mcp_-32603"),
        (
            400,
            "application/json",
            json.dumps(
                {"jsonrpc": "2.0", "id": 0, "error": {"code": -32601, "message": "no"}}
            ).encode(),
            Fate.REFUSED,
            "mcp_-32601",
        ),
        (202, "text/plain", b"", Fate.UNKNOWN, "mcp_-32600"),
        (200, "text/html", b"<p>hi</p>", Fate.UNKNOWN, "mcp_-32600"),
    ],
    ids=[
        "stream",
        "stream-no-answer",
        "bad-json",
        "json",
        "json-another-id",
        "json-error-another-id",
        "404",
        "500",
        "400-error",
        "202",
        "html",
    ],
)
async def test_what_one_post_answers_is_read_as_the_sdk_reads_it(
    status: int, kind: str, body: bytes, fate: Fate, why: str
) -> None:
    async with serving(replying(status, kind, body)) as url:
        connection = HttpConnection(url, _version="2026-07-28")
        answer = await McpUpstream(connection).deliver(effect({}), "h-2", time.monotonic() + 5)
        await connection.aclose()
    assert (answer.fate, answer.why) == (fate, why)


async def test_a_refused_connection_is_not_sent() -> None:
    with socket.socket() as bound:  # a port of this machine's that nobody listens on
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/mcp"
        connection = HttpConnection(url, _version="2026-07-28")
        answer = await McpUpstream(connection).deliver(effect({}), "h-3", time.monotonic() + 5)
        await connection.aclose()
    assert (answer.fate, answer.why) == (Fate.NOT_SENT, "upstream_refused")


async def test_a_server_that_takes_the_call_and_hangs_up_is_ambiguous() -> None:
    """The POST was written on an open connection, then the server closed it without
    an answer: it may have acted, so the hold stays charged."""
    taken = asyncio.Event()

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        taken.set()
        writer.close()

    listener = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    async with listener:
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/mcp"
        connection = HttpConnection(url, _version="2026-07-28")
        answer = await McpUpstream(connection).deliver(effect({}), "h-4", time.monotonic() + 5)
        await connection.aclose()
    assert taken.is_set()
    assert (answer.fate, answer.why) == (Fate.UNKNOWN, "upstream_reset")


@asynccontextmanager
async def json_rpc_server(head: bytes = b"") -> AsyncIterator[tuple[str, list[int]]]:
    """A raw server answering each `tools/call` with RESULT under its id, `head` among
    its answer's header fields: its URL and a count of the connections it was opened."""
    opened = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened[0] += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                length = int(request_head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                request = json.loads(await reader.readexactly(length))
                reply = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": RESULT})
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + head
                    + f"content-length: {len(reply)}\r\n\r\n{reply}".encode()
                )
                await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with listener:
        yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/mcp", opened


async def test_an_idle_connection_is_dropped_before_the_server_would_drop_it() -> None:
    """As the HTTP forwards' (tests/gateway/test_forward_client.py): a call after 2.5 s
    idle goes on a new connection, not on one the server may be closing."""
    async with json_rpc_server() as (url, opened):
        connection = HttpConnection(url, _version="2026-07-28")
        upstream = McpUpstream(connection)
        first = await upstream.deliver(effect({}), "h-5", time.monotonic() + 5)
        await asyncio.sleep(2.5)
        second = await upstream.deliver(effect({}), "h-6", time.monotonic() + 5)
        await connection.aclose()
    assert (first.fate, second.fate) == (Fate.DELIVERED, Fate.DELIVERED)
    assert opened[0] == 2


async def test_a_result_with_a_long_header_block_is_delivered() -> None:
    """As a forward's (tests/gateway/test_forward_client.py): a 9 KB header field does
    not make a result ambiguous (aiohttp's default limit is 8,190 bytes)."""
    async with json_rpc_server(b"x-token: " + b"t" * 9000 + b"\r\n") as (url, _):
        connection = HttpConnection(url, _version="2026-07-28")
        answer = await McpUpstream(connection).deliver(effect({}), "h-7", time.monotonic() + 5)
        await connection.aclose()
    assert answer.fate is Fate.DELIVERED, answer
