"""The forward's client (gateway/state/http_upstream.py make_client: httpx's client
over aiohttp, gateway/state/http_upstream.py) against raw loopback servers that
record the bytes they are sent: the request priced is the request sent, byte for
byte where it matters; nothing an answer sets rides along on the next forward; and
every failure is read as the same fate httpx's own transport gave it."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from gateway.edge.wire import StoredRequest
from gateway.pipeline.upstream import Fate
from gateway.state.http_upstream import AiohttpTransport, HttpTarget, HttpUpstream, make_client

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Answerer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@asynccontextmanager
async def raw_server(answer: Answerer) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A server that reads each request on a connection and lets `answer` reply: its
    URL, the requests it read, and a count of the connections it was opened."""
    requests: list[bytes] = []
    connections = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                request = await read_request(reader)
                requests.append(request)
                await answer(request, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", requests, connections
    finally:
        server.close()


async def ok(request: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(OK)
    await writer.drain()


def effect(path: str = "/orders", body: bytes = b'{"n":1}', method: str = "POST") -> StoredRequest:
    return StoredRequest(
        agent="a",
        tool="t",
        method=method,
        path=path,
        query="",
        content_type="application/json",
        body_b64=base64.b64encode(body).decode(),
        route_id="r",
        price=1,
    )


async def forward(url: str, request: StoredRequest, timeout_s: float = 5.0) -> tuple[Fate, str]:
    async with make_client(1.0, timeout_s, 4) as client:
        upstream = HttpUpstream(client, HttpTarget(url, credentials=(("x-api-key", "k"),)))
        answer = await upstream.deliver(request, "h1", time.monotonic() + 10)
    return answer.fate, answer.why


def head_of(request: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = request.split(b"\r\n\r\n")[0].split(b"\r\n")
    fields = [line.partition(b":") for line in lines[1:]]
    return lines[0], [(k.strip().lower(), v.strip()) for k, _, v in fields]


async def test_the_request_sent_is_the_request_priced() -> None:
    async with raw_server(ok) as (url, requests, _):
        fate, _why = await forward(url, effect("/a?b/%/x;y"))
    assert fate is Fate.DELIVERED
    line, fields = head_of(requests[0])
    # The decoded path as priced, each reserved character escaped, not re-quoted.
    assert line == b"POST /a%3Fb/%25/x%3By HTTP/1.1"
    names = [k for k, _ in fields]
    for name in (b"content-type", b"user-agent", b"accept", b"accept-encoding", b"host"):
        assert names.count(name) == 1, (name, fields)
    assert dict(fields)[b"content-type"] == b"application/json"
    assert dict(fields)[b"x-api-key"] == b"k"
    assert dict(fields)[b"idempotency-key"]
    assert requests[0].endswith(b'\r\n\r\n{"n":1}')


@pytest.mark.parametrize(
    ("method", "body", "length"),
    [
        ("DELETE", b"", None),
        ("GET", b"", None),
        ("POST", b"", b"0"),
        ("PUT", b"", b"0"),
        ("PATCH", b"", b"0"),
        ("DELETE", b'{"n":1}', b"7"),
    ],
)
async def test_a_body_is_framed_as_httpx_frames_it(
    method: str, body: bytes, length: bytes | None
) -> None:
    """A DELETE or GET without a body goes without Content-Length (RFC 9110 8.6: a
    method whose semantics anticipate no content), as httpx's own transport sent it;
    aiohttp added `Content-Length: 0` to a DELETE. POST, PUT and PATCH say 0. A
    DELETE with a body (priced with it) says its length: a body sent unframed would
    be read by the server as the start of another request."""
    async with raw_server(ok) as (url, requests, _):
        fate, _why = await forward(url, effect(method=method, body=body))
    assert fate is Fate.DELIVERED
    _line, fields = head_of(requests[0])
    assert [v for k, v in fields if k == b"content-length"] == ([] if length is None else [length])
    assert b"transfer-encoding" not in dict(fields)
    assert requests[0].endswith(b"\r\n\r\n" + body)
    assert len(requests) == 1


async def test_a_cookie_an_answer_sets_never_rides_on_the_next_forward() -> None:
    async def set_cookie(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nset-cookie: session=abc; Path=/\r\ncontent-length: 2\r\n\r\n{}"
        )
        await writer.drain()

    async with (
        raw_server(set_cookie) as (url, requests, connections),
        make_client(1.0, 5.0, 4) as client,
    ):
        upstream = HttpUpstream(client, HttpTarget(url))
        for hold in ("h1", "h2", "h3"):
            answer = await upstream.deliver(effect(), hold, time.monotonic() + 10)
            assert answer.fate is Fate.DELIVERED
    assert len(requests) == 3
    assert not any(b"cookie:" in r.lower().split(b"\r\n\r\n")[0] for r in requests[1:])
    assert connections[0] == 1  # one pooled connection, kept alive between forwards


async def test_a_server_that_takes_the_forward_and_hangs_up_leaves_it_ambiguous() -> None:
    async def hang_up(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with raw_server(hang_up) as (url, requests, _):
        assert await forward(url, effect()) == (Fate.UNKNOWN, "upstream_reset")
    assert len(requests) == 1  # it was sent, and not sent again


async def test_a_half_answer_is_ambiguous() -> None:
    async def half(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()

    async with raw_server(half) as (url, _, _):
        assert await forward(url, effect()) == (Fate.UNKNOWN, "upstream_reset")


async def test_an_answer_that_never_comes_is_a_timeout() -> None:
    async def stall(request: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)

    async with raw_server(stall) as (url, requests, _):
        assert await forward(url, effect(), timeout_s=0.3) == (Fate.UNKNOWN, "upstream_timeout")
    assert len(requests) == 1


async def test_a_port_nobody_listens_on_is_not_sent() -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        assert await forward(url, effect()) == (Fate.NOT_SENT, "upstream_refused")


async def test_an_idle_connection_is_dropped_before_the_server_would_drop_it() -> None:
    """Common servers close an idle connection after 5 s (uvicorn, node); a forward
    written on one as it closes comes back reset, an ambiguous effect never made. So
    the client drops its idle connections first: a forward after 2.5 s idle opens a
    new one."""
    async with (
        raw_server(ok) as (url, requests, connections),
        make_client(1.0, 5.0, 4) as client,
    ):
        upstream = HttpUpstream(client, HttpTarget(url))
        first = await upstream.deliver(effect(), "h1", time.monotonic() + 10)
        await asyncio.sleep(2.5)
        second = await upstream.deliver(effect(), "h2", time.monotonic() + 10)
    assert (first.fate, second.fate) == (Fate.DELIVERED, Fate.DELIVERED)
    assert len(requests) == 2 and connections[0] == 2


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
@pytest.mark.parametrize("server_stays", [True, False], ids=["server-stays", "server-gone"])
async def test_a_put_or_delete_the_server_took_is_never_sent_again_by_the_client(
    method: str, server_stays: bool
) -> None:
    """The server reads the request and hangs up (and then, maybe, stops listening).
    aiohttp resent such methods on a new connection by itself, and that attempt's
    refusal read as "not sent", or its answer as the effect's, for a request the
    server had. The client sends once; the gateway decides about resending."""
    requests: list[bytes] = []

    async def take_and_hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await read_request(reader))
        if not server_stays:
            listener.close()  # the next connect is refused
        writer.close()

    listener = await asyncio.start_server(take_and_hang_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        fate = await forward(url, effect(method=method, body=b""))
    finally:
        listener.close()
    assert fate == (Fate.UNKNOWN, "upstream_reset")
    assert len(requests) == 1


async def test_a_stray_answer_on_an_idle_connection_is_not_the_next_forwards() -> None:
    """After answering, the server writes another answer on the idle connection (a 201
    of a request nobody sent). The next forward must not read it as its own: it goes on
    a new connection and gets its own answer."""

    first_read = asyncio.Event()

    async def answer_twice(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(OK)
        await writer.drain()
        if b"/first" in request.split(b"\r\n")[0]:
            await first_read.wait()  # the connection is back in the pool, idle
            writer.write(b'HTTP/1.1 201 Created\r\ncontent-length: 14\r\n\r\n{"stale":true}')
            await writer.drain()

    async with (
        raw_server(answer_twice) as (url, requests, connections),
        make_client(1.0, 5.0, 4) as client,
    ):
        upstream = HttpUpstream(client, HttpTarget(url))
        first = await upstream.deliver(effect("/first"), "h1", time.monotonic() + 10)
        first_read.set()
        transport = client._transport
        assert isinstance(transport, AiohttpTransport)
        pooled = transport.session().connector._conns  # type: ignore[union-attr]
        # The stray answer has reached the idle connection: its bytes wait on it.
        deadline = time.monotonic() + 5
        while not any(proto.should_close for idle in pooled.values() for proto, _ in idle):
            assert time.monotonic() < deadline, "the stray answer never arrived"
            await asyncio.sleep(0.01)
        second = await upstream.deliver(effect("/second"), "h2", time.monotonic() + 10)
    assert (first.fate, second.fate) == (Fate.DELIVERED, Fate.DELIVERED)
    assert second.payload == b"{}"
    assert [r.split(b" ")[1] for r in requests] == [b"/first", b"/second"]
    assert connections[0] == 2


@pytest.mark.parametrize(
    "fields",
    [[(b"x-token", b"t" * 9000)], [(f"x-h{i}".encode(), b"v") for i in range(200)]],
    ids=["a-9-KB-field", "200-fields"],
)
async def test_a_2xx_with_a_long_header_block_is_delivered(
    fields: list[tuple[bytes, bytes]],
) -> None:
    """Within what httpcore read (100 KB of header block), a 2xx is the effect made:
    aiohttp's default limits (8,190 bytes a field, 128 fields) made it ambiguous."""
    block = b"".join(k + b": " + v + b"\r\n" for k, v in fields)

    async def long_head(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 201 Created\r\n" + block + b"content-length: 2\r\n\r\n{}")
        await writer.drain()

    async with raw_server(long_head) as (url, _, _):
        assert await forward(url, effect()) == (Fate.DELIVERED, "upstream_201")


async def test_a_2xx_whose_body_cannot_be_decoded_is_ambiguous() -> None:
    """A 201 that says gzip and is not: the effect may have been made and there is no
    body to give the agent. It was raised out of the forward (no fate, no settlement)."""

    async def bad_gzip(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 201 Created\r\ncontent-encoding: gzip\r\ncontent-length: 9\r\n\r\nnot gzip!"
        )
        await writer.drain()

    async with raw_server(bad_gzip) as (url, requests, _):
        assert await forward(url, effect()) == (Fate.UNKNOWN, "upstream_undecodable")
    assert len(requests) == 1


async def test_a_forward_that_finds_every_pooled_connection_busy_says_so() -> None:
    """Every connection of the worker's pool is taken (by another tenant's forward to a
    stuck upstream): a forward that waits past its connect timeout for one is not sent,
    and says it was the pool, not the upstream (before, it read as
    `upstream_connect_timeout`: an operator looked for a network fault at a healthy
    upstream). A connection freed later serves the next forward."""
    release = asyncio.Event()

    async def held(request: bytes, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(OK)
        await writer.drain()

    async with (
        raw_server(held) as (stuck_url, stuck_seen, _),
        raw_server(ok) as (healthy_url, healthy_seen, _),
        make_client(0.3, 5.0, 1) as client,
    ):
        stuck = HttpUpstream(client, HttpTarget(stuck_url))
        healthy = HttpUpstream(client, HttpTarget(healthy_url))
        first = asyncio.create_task(stuck.deliver(effect(), "h1", time.monotonic() + 10))
        while not stuck_seen:
            await asyncio.sleep(0.01)
        answer = await healthy.deliver(effect(), "h2", time.monotonic() + 10)
        assert (answer.fate, answer.why) == (Fate.NOT_SENT, "upstream_pool_timeout")
        assert healthy_seen == []
        release.set()
        assert (await first).fate is Fate.DELIVERED
        answer = await healthy.deliver(effect(), "h3", time.monotonic() + 10)
        assert answer.fate is Fate.DELIVERED
    assert len(healthy_seen) == 1


async def test_no_failure_keeps_a_connection_of_the_pool() -> None:
    """Each way a forward can end without an answer, one after another on a pool of one
    connection, then a forward that must get that connection: a slot of the pool kept
    by any of them (never given back) would leave it waiting, then not sent."""

    async def hang_up(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def half(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()

    async def stall(request: bytes, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)

    async def trickle(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(3)

    async def bad_gzip(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 201 Created\r\ncontent-encoding: gzip\r\ncontent-length: 1\r\n\r\nx"
        )
        await writer.drain()

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{unused.getsockname()[1]}"
    ended = []
    async with make_client(0.5, 0.3, 1) as client:
        for answerer in (hang_up, half, stall, trickle, bad_gzip):
            async with raw_server(answerer) as (url, _, _):
                upstream = HttpUpstream(client, HttpTarget(url))
                ended.append((await upstream.deliver(effect(), "h", time.monotonic() + 10)).why)
                # Cut off by the hold's deadline mid-answer, not by a read timeout.
                ended.append((await upstream.deliver(effect(), "h", time.monotonic() + 0.1)).why)
        upstream = HttpUpstream(client, HttpTarget(refused))
        ended.append((await upstream.deliver(effect(), "h", time.monotonic() + 10)).why)
        async with raw_server(ok) as (url, requests, _):
            upstream = HttpUpstream(client, HttpTarget(url))
            answer = await upstream.deliver(effect(), "h", time.monotonic() + 10)
    assert "upstream_pool_timeout" not in ended
    assert (answer.fate, answer.why) == (Fate.DELIVERED, "upstream_200"), ended
    assert len(requests) == 1
