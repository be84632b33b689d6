"""A `tools/call` to a server whose modern version is pinned is one POST on the pooled
client (gateway/state/mcp_upstream.py, HttpConnection.call_tool): against the SDK's own
Streamable HTTP server answering as JSON and as an event stream, in process; and the
HTTP refusals the SDK's transport turns into JSON-RPC errors, read as the same
fates (a 404 refuses, a 500 or a stream without an answer is ambiguous)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager

from gateway.edge.wire import StoredRequest
from gateway.pipeline.upstream import Fate
from gateway.state.mcp_upstream import HOLD_META, KEY_META, HttpConnection, McpUpstream

URL = "http://mcp.test/mcp"
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
async def sdk_server(json_response: bool) -> AsyncIterator[HttpConnection]:
    server: Server[Any] = Server("echo", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(app=server, json_response=json_response, stateless=True)
    async with manager.run():
        connection = HttpConnection(URL, credentials=(("authorization", "Bearer tool-secret"),))
        transport = httpx2.ASGITransport(app=StreamableHTTPASGIApp(manager))
        connection._client = httpx2.AsyncClient(
            transport=transport, headers=dict(connection.credentials)
        )
        yield connection
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


def replying(status: int, kind: str, body: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    def reply(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": kind}, content=body)

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
    ids=["stream", "stream-no-answer", "bad-json", "404", "500", "400-error", "202", "html"],
)
async def test_what_one_post_answers_is_read_as_the_sdk_reads_it(
    status: int, kind: str, body: bytes, fate: Fate, why: str
) -> None:
    connection = HttpConnection(URL, _version="2026-07-28")
    transport = httpx2.MockTransport(replying(status, kind, body))
    connection._client = httpx2.AsyncClient(transport=transport)
    answer = await McpUpstream(connection).deliver(effect({}), "h-2", time.monotonic() + 5)
    assert (answer.fate, answer.why) == (fate, why)


async def test_a_refused_connection_is_not_sent() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    connection = HttpConnection(URL, _version="2026-07-28")
    connection._client = httpx2.AsyncClient(transport=httpx2.MockTransport(refuse))
    answer = await McpUpstream(connection).deliver(effect({}), "h-3", time.monotonic() + 5)
    assert (answer.fate, answer.why) == (Fate.NOT_SENT, "upstream_refused")
