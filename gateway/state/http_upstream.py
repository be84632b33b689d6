"""The HTTP implementation of `Upstream` (gateway/pipeline/upstream.py): an admitted effect
forwarded to its tool API, and what the answer means for the hold: 2xx delivered,
4xx refused, never sent (connection refused, pool or connect timeout) not sent;
timeout, 5xx, a connection lost after sending unknown; on the retry of an ambiguous
hold, the tool's "in progress" statuses (409 by default) in progress. Below it, the
transport every forward and every pinned MCP call is sent through (aiohttp's, under
httpx's client) and the rules each of its sessions keeps (upstream_session)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import aiohttp
import httpx
import yarl

from gateway.edge.wire import KEPT_RESPONSE_HEADERS, Headers, StoredRequest, upstream_key
from gateway.pipeline.upstream import Answer, Fate, HttpMeta
from pricing import wire_path

log = logging.getLogger("irrev.gateway")


@dataclass(frozen=True)
class HttpTarget:
    """A tool's API as the gateway calls it: where, with which credentials (added to
    every request, kept out of reprs so no log line or traceback shows them), which
    of its answer headers reach the agent, and which statuses mean "a request under
    this Idempotency-Key is still being made" (the IETF Idempotency-Key draft's 409)."""

    base_url: str
    credentials: Headers = field(default=(), repr=False)
    kept_headers: frozenset[str] = KEPT_RESPONSE_HEADERS
    in_progress: frozenset[int] = frozenset({409})


# 4xx answers that can come after the handler made the effect: Not Acceptable is
# decided when the answer is written (Express's res.format, a Rails respond_to after
# the save), so it proves nothing about the effect.
AFTER_THE_EFFECT_4XX = frozenset({406})


def fate_of_status(status: int) -> Fate:
    if 200 <= status < 300:
        return Fate.DELIVERED
    if 400 <= status < 500 and status not in AFTER_THE_EFFECT_4XX:
        return Fate.REFUSED
    # 5xx, and anything a tool API should not answer to an effect (1xx, 3xx): the
    # effect may or may not have happened.
    return Fate.UNKNOWN


UPSTREAM_KEEPALIVE_S = 2.0


def make_client(
    connect_timeout_s: float, timeout_s: float, max_connections: int
) -> httpx.AsyncClient:
    """The client every forward goes through: httpx's, sending over aiohttp
    (AiohttpTransport, below). An idle connection is dropped before common
    servers close theirs (uvicorn and node after 5 s): a forward sent on a socket the
    server is closing would come back as a reset, i.e. an ambiguous effect that was
    never made."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=connect_timeout_s),
        transport=AiohttpTransport(max_connections, UPSTREAM_KEEPALIVE_S),
        follow_redirects=False,
        trust_env=False,
        # One client serves every tenant and agent: a cookie an answer sets must never
        # ride along on anyone's next request (nor change what was priced).
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
    )


@dataclass(frozen=True)
class UpstreamSlots:
    """A tenant's share of the shared client's connections: at most the semaphore's
    value of its requests in flight at once; one that finds no slot within `wait_s`
    is not sent (Fate.NOT_SENT, why `upstream_tenant_busy`)."""

    semaphore: asyncio.Semaphore
    wait_s: float


# Where an agent's idempotency key travels to the proxy, as the messages that ask for it say.
HTTP_KEY = "Idempotency-Key"


@dataclass(frozen=True)
class HttpUpstream:
    """`Upstream` over HTTP: one shared client (make_client), one tool's target, and
    the tenant's slots of that client (None: unbounded)."""

    client: httpx.AsyncClient
    target: HttpTarget
    resends: bool = True  # contract 4: a tool API deduplicates by Idempotency-Key
    slots: UpstreamSlots | None = None

    @property
    def key_name(self) -> str:
        return HTTP_KEY

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        """Send the very request that was priced, with the headers the agent may pass,
        the derived Idempotency-Key (reads, which hold nothing, go without one) and the
        tool's credentials. httpx's timeouts bound each read; `deadline` bounds the
        whole exchange, so an upstream that trickles its answer cannot keep a forward
        open past the hold's deadline."""
        if time.monotonic() >= deadline:
            # Too late to begin: said so, not left to a timeout of zero (which would
            # call a request never begun unknown) or to the slots (busy).
            return Answer(fate=Fate.NOT_SENT, why="hold_deadline")
        try:
            request = self._request(effect, hold_id)
        except Exception as exc:
            # Built before anything is sent: a request httpx cannot make (a URL past its
            # length, a header it cannot encode) provably never left, and its hold must
            # be released, not left charged as an unknown fate.
            # The type only: an encoding error's text quotes the value, maybe a credential.
            why = type(exc).__name__
            log.warning("request not sendable", extra={"hold_id": hold_id, "why": why})
            return Answer(fate=Fate.NOT_SENT, why="request_not_sendable")
        if self.slots is None:
            return await self._send(request, deadline, retry)
        semaphore = self.slots.semaphore
        wait_s = min(self.slots.wait_s, max(deadline - time.monotonic(), 0.0))
        if wait_s > 0 and not semaphore.locked():
            # A free slot is taken at once (acquire returns without suspending): a
            # timeout around it would cost a timer on every forward for nothing.
            await semaphore.acquire()
        else:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the slot
                # when a cancellation races its handover, and the forward was sent
                # anyway (tests/gateway/test_cancel_races.py).
                async with asyncio.timeout(wait_s):
                    await semaphore.acquire()
            except TimeoutError:
                return Answer(fate=Fate.NOT_SENT, why="upstream_tenant_busy")
        try:
            return await self._send(request, deadline, retry)
        finally:
            semaphore.release()

    def _request(self, effect: StoredRequest, hold_id: str) -> httpx.Request:
        url = self.target.base_url.rstrip("/") + wire_path(effect.path)
        url += f"?{effect.query}" if effect.query else ""
        headers = httpx.Headers(list(effect.headers))
        if hold_id:
            headers["Idempotency-Key"] = upstream_key(hold_id)
            headers["X-Irrev-Hold"] = hold_id
        if effect.content_type:
            headers["Content-Type"] = effect.content_type
        for name, value in self.target.credentials:
            headers[name] = value
        return self.client.build_request(effect.method, url, content=effect.body, headers=headers)

    async def _send(self, request: httpx.Request, deadline: float, retry: bool) -> Answer:
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                response = await self._exchange(request)
        except TimeoutError:
            return Answer(fate=Fate.UNKNOWN, why="upstream_timeout")
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return Answer(fate=Fate.NOT_SENT, why=_why(exc))
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return Answer(fate=Fate.UNKNOWN, why=_why(exc))
        except httpx.DecodingError:
            # An answer whose body its Content-Encoding cannot decode: whatever its
            # status, the effect may have been made, and the agent gets no body.
            return Answer(fate=Fate.UNKNOWN, why="upstream_undecodable")
        status = response.status_code
        # On a retry, the upstream may still be making the first request under this
        # key: that answer is not a refusal of the effect.
        in_progress = retry and status in self.target.in_progress
        kept = tuple(
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() in self.target.kept_headers
        )
        return Answer(
            fate=Fate.IN_PROGRESS if in_progress else fate_of_status(status),
            payload=response.content,
            media_type=response.headers.get("content-type", ""),
            why=f"upstream_{status}",
            http=HttpMeta(status, kept),
        )

    async def _exchange(self, request: httpx.Request) -> httpx.Response:
        """`client.send(request)` without the layers a forward never uses: the cookie
        jar refuses every cookie (make_client), yet each answer was wrapped in urllib's
        request and response objects for it to look at; no auth flow, no redirect is
        followed, no event hook. The client's own transport sends it, with its pool,
        limits, timeouts (`build_request` set them) and tracing (which wraps that
        transport)."""
        transport = self.client._transport_for_url(request.url)
        response = await transport.handle_async_request(request)
        response.request = request
        try:
            await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response


def _why(exc: Exception) -> str:
    names: dict[type[Exception], str] = {
        httpx.ConnectError: "upstream_refused",
        httpx.ConnectTimeout: "upstream_connect_timeout",
        httpx.PoolTimeout: "upstream_pool_timeout",
        httpx.ReadTimeout: "upstream_timeout",
        httpx.WriteTimeout: "upstream_timeout",
        httpx.RemoteProtocolError: "upstream_reset",
        httpx.ReadError: "upstream_reset",
        httpx.WriteError: "upstream_reset",
    }
    return names.get(type(exc), "upstream_error")


# httpx's transport over aiohttp: the gateway's forwards keep httpx's client (its
# requests, timeouts, exceptions, and the tracing that wraps its transport) and send
# through aiohttp's pool and parser, as LiteLLM's proxy does. Why: on this machine
# httpcore's pool, h11 and anyio cost 2.0-3.4 ms of a worker's CPU per forward where
# aiohttp's cost 0.4-0.6 ms (the same loopback server, 8 concurrent requests), the
# largest single part of an admitted effect's CPU. What a forward's fate is read from
# stays httpx's vocabulary (`_why` above): aiohttp's failures are raised as the httpx
# exceptions that mean the same thing. No connection, or none in time, is ConnectError
# or ConnectTimeout (nothing was sent); a failure after the request could have been
# written is a read, write or protocol error (ambiguous).

# httpx writes these itself (build_request); aiohttp must not add its own beside them.
_HTTPX_WRITES = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# An answer's header block, bounded as httpcore bounded it (100 KB in all) without
# refusing what it read: a line or field up to 64 KB, up to 256 fields. aiohttp's
# defaults (8,190 bytes, 128 fields) made real 2xx answers with a long header
# (a 9 KB token, a large Link) ambiguous.
_MAX_FIELD_BYTES = 64 * 1024
_MAX_FIELDS = 256


class _Request(aiohttp.ClientRequest):
    """aiohttp's request, but a DELETE without a body goes without `Content-Length: 0`,
    as a GET does (RFC 9110 8.6: no Content-Length where the method's semantics
    anticipate no content), and as httpx's transport sent it."""

    GET_METHODS = aiohttp.ClientRequest.GET_METHODS | {"DELETE"}


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
    such session must hold to: an empty body framed as httpx frames it (_Request), no
    cookie kept (one agent's answer must not ride on another's request), no proxy from
    the environment, an idle connection dropped after `keepalive_s` and never reused
    with a stray answer on it (CleanConnector), header blocks read up to
    _MAX_FIELD_BYTES and _MAX_FIELDS, and nothing resent by aiohttp. `options` are the
    caller's own (headers, timeouts, decoding)."""
    session = aiohttp.ClientSession(
        connector=CleanConnector(limit=max_connections, keepalive_timeout=keepalive_s),
        request_class=_Request,
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
    """httpx's per-request timeouts as aiohttp's, past the pool's wait (the transport's
    own, AiohttpTransport): connect bounds getting the socket, read each read."""
    given = request.extensions.get("timeout", {})
    connect, read = given.get("connect"), given.get("read")
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=read)


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

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        request: httpx.Request,
        slot: asyncio.Semaphore,
    ) -> None:
        self.response = response
        self.request = request
        self._slot: asyncio.Semaphore | None = slot

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
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One upstream_session (made in the worker's loop on first use) under an httpx
    client: at most `max_connections` open, an idle one kept `keepalive_s`, no
    redirect followed, and an answer's body handed to httpx as it came (httpx decodes
    it, as with its own transport).

    The wait for a free connection is the transport's own (`_slots`, held until the
    answer's body is closed), not aiohttp's: aiohttp raises the same timeout for a
    pool that stayed full as for an upstream that never took the connection, and the
    first is the gateway's load (httpx.PoolTimeout: `upstream_pool_timeout`), the
    second the upstream's (`upstream_connect_timeout`). aiohttp's own limit, the
    same, is then never waited on."""

    def __init__(self, max_connections: int, keepalive_s: float) -> None:
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(max_connections)

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
        await self._slot(request)
        response: aiohttp.ClientResponse | None = None
        try:
            response = await self._send(request)
            return httpx.Response(
                response.status,
                headers=[(k, v) for k, v in response.raw_headers],
                stream=_Body(response, request, self._slots),
                request=request,
                extensions={
                    "http_version": b"HTTP/1.1",
                    "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
                },
            )
        except BaseException:
            # No body for httpx to close, and so to give the slot back.
            if response is not None:
                response.close()
            self._slots.release()
            raise

    async def _slot(self, request: httpx.Request) -> None:
        if not self._slots.locked():
            # Taken at once (acquire returns without suspending): no timer for nothing.
            await self._slots.acquire()
            return
        try:
            # asyncio.timeout, not wait_for: see HttpUpstream.deliver.
            async with asyncio.timeout(request.extensions.get("timeout", {}).get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(
                "every connection of the pool is busy", request=request
            ) from None

    async def _send(self, request: httpx.Request) -> aiohttp.ClientResponse:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            return await self.session().request(
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

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
