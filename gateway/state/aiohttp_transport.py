"""httpx's transport over aiohttp: the gateway's forwards keep httpx's client (its
requests, timeouts, exceptions, and the tracing that wraps its transport) and send
through aiohttp's pool and parser, as LiteLLM's proxy does.

Why: on this machine httpcore's pool, h11 and anyio cost 2.0-3.4 ms of a worker's
CPU per forward where aiohttp's cost 0.4-0.6 ms (the same loopback server, 8
concurrent requests), the largest single part of an admitted effect's CPU.

What a forward's fate is read from stays httpx's vocabulary (gateway/state/
http_upstream.py `_why`): aiohttp's failures are raised as the httpx exceptions
that mean the same thing. No connection, or none in time, is ConnectError or
ConnectTimeout (nothing was sent); a failure after the request could have been
written is a read, write or protocol error (ambiguous)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import yarl

# httpx writes these itself (build_request); aiohttp must not add its own beside them.
_HTTPX_WRITES = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# An answer's header block, bounded as httpcore bounded it (100 KB in all) without
# refusing what it read: a line or field up to 64 KB, up to 256 fields. aiohttp's
# defaults (8,190 bytes, 128 fields) made real 2xx answers with a long header
# (a 9 KB token, a large Link) ambiguous.
_MAX_FIELD_BYTES = 64 * 1024
_MAX_FIELDS = 256


class CleanConnector(aiohttp.TCPConnector):
    """aiohttp's pool, but an idle connection with bytes already waiting on it is
    closed, not reused: a server's stray answer (a 408 before it closes, a duplicate
    201) would otherwise be read as the next forward's, which was never written
    (httpcore drops such a connection too)."""

    async def _get(
        self, key: aiohttp.connector.ConnectionKey, traces: list[aiohttp.tracing.Trace]
    ) -> aiohttp.connector.Connection | None:
        while (connection := await super()._get(key, traces)) is not None:
            protocol = connection.protocol
            if protocol is not None and not protocol.should_close:
                return connection
            connection.close()
        return None


def upstream_session(
    max_connections: int, keepalive_s: float, **options: Any
) -> aiohttp.ClientSession:
    """An aiohttp session to a tenant's upstreams (forwards, MCP POSTs), with what every
    such session must hold to: no cookie kept (one agent's answer must not ride on
    another's request), no proxy from the environment, an idle connection dropped after
    `keepalive_s` and never reused with a stray answer on it (CleanConnector), header
    blocks read up to _MAX_FIELD_BYTES and _MAX_FIELDS, and nothing resent by aiohttp.
    `options` are the caller's own (headers, timeouts, decoding)."""
    session = aiohttp.ClientSession(
        connector=CleanConnector(limit=max_connections, keepalive_timeout=keepalive_s),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        max_line_size=_MAX_FIELD_BYTES,
        max_field_size=_MAX_FIELD_BYTES,
        max_headers=_MAX_FIELDS,
        **options,
    )
    # aiohttp sends a GET, HEAD, PUT or DELETE again on a new connection when the
    # first one fails after it was written; that second attempt's failure (refused:
    # "not sent") or answer (a 404) would then decide the fate of an effect the server
    # may have made. The gateway decides about resending (contract 4), so aiohttp
    # never does. No public switch: this is the one aiohttp's own test client sets;
    # tests/gateway/test_forward_client.py fails if it stops working.
    session._retry_connection = False
    return session


def _timeout(request: httpx.Request) -> aiohttp.ClientTimeout:
    """httpx's per-request timeouts as aiohttp's: the pool's wait and the connect
    together bound getting a connection, connect alone the socket's, read each read."""
    given = request.extensions.get("timeout", {})
    pool, connect, read = given.get("pool"), given.get("connect"), given.get("read")
    waits = None if pool is None or connect is None else pool + connect
    return aiohttp.ClientTimeout(total=None, connect=waits, sock_connect=connect, sock_read=read)


def _raised(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """aiohttp's failure as the httpx exception of the same meaning."""
    text = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text, request=request)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return httpx.ReadTimeout(text, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text, request=request)
    return httpx.ReadError(text, request=request)


class _Body(httpx.AsyncByteStream):
    """An aiohttp answer's body as httpx reads it; closing it returns the connection
    to the pool when the body was read to its end, and drops it otherwise."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self.response = response
        self.request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _raised(exc, self.request) from exc

    async def aclose(self) -> None:
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One upstream_session (made in the worker's loop on first use) under an httpx
    client: at most `max_connections` open, an idle one kept `keepalive_s`, no
    redirect followed, and an answer's body handed to httpx as it came (httpx decodes
    it, as with its own transport)."""

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = upstream_session(
                self.max_connections,
                self.keepalive_s,
                auto_decompress=False,
                skip_auto_headers=_HTTPX_WRITES,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            response = await self.session().request(
                request.method,
                # As httpx encoded it, not re-quoted: the path sent is the path priced.
                yarl.URL(str(request.url), encoded=True),
                headers=headers,
                data=request.content or None,
                allow_redirects=False,
                timeout=_timeout(request),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _raised(exc, request) from exc
        return httpx.Response(
            response.status,
            headers=[(k, v) for k, v in response.raw_headers],
            stream=_Body(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
