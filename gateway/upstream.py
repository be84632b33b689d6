"""Forwarding an admitted effect to its tool API, and what the answer means for the
hold: delivered (2xx: post), refused (4xx, or never sent: void), unknown (timeout,
5xx, a connection lost after sending: ambiguous, stays charged), or, on the retry
of an ambiguous hold, in progress (the upstream is still making the first request:
stays ambiguous)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import quote

import httpx

from .wire import KEPT_RESPONSE_HEADERS, Headers, StoredRequest, upstream_key


class Fate(StrEnum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class Upstream:
    """A tool's API as the gateway calls it: where, with which credentials (added to
    every request, kept out of reprs so no log line or traceback shows them), and
    which of its answer headers reach the agent."""

    base_url: str
    credentials: Headers = field(default=(), repr=False)
    kept_headers: frozenset[str] = KEPT_RESPONSE_HEADERS
    in_progress: frozenset[int] = frozenset({409})


@dataclass(frozen=True)
class Answer:
    fate: Fate
    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    why: str = ""
    elapsed_s: float = 0.0


def fate_of_status(status: int) -> Fate:
    if 200 <= status < 300:
        return Fate.DELIVERED
    if 400 <= status < 500:
        return Fate.REFUSED
    # 5xx, and anything a tool API should not answer to an effect (1xx, 3xx): the
    # effect may or may not have happened.
    return Fate.UNKNOWN


UPSTREAM_KEEPALIVE_S = 2.0


def make_client(
    connect_timeout_s: float, timeout_s: float, max_connections: int
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=connect_timeout_s),
        # An idle connection is dropped before common servers close theirs (uvicorn and
        # node after 5 s): a forward sent on a socket the server is closing would come
        # back as a reset, i.e. an ambiguous effect that was never made.
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=UPSTREAM_KEEPALIVE_S,
        ),
        follow_redirects=False,
        trust_env=False,
        # One client serves every tenant and agent: a cookie an answer sets must never
        # ride along on anyone's next request (nor change what was priced).
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
    )


async def forward(
    client: httpx.AsyncClient,
    upstream: Upstream,
    request: StoredRequest,
    hold_id: str,
    total_s: float,
) -> Answer:
    """Send the very request that was priced, with the headers the agent may pass, the
    derived Idempotency-Key (reads, which hold nothing, go without one) and the tool's
    credentials. httpx's timeouts bound each read; `total_s` bounds the whole
    exchange, so an upstream that trickles its answer cannot keep a forward open past
    the hold's deadline."""
    url = upstream.base_url.rstrip("/") + upstream_path(request.path)
    url += f"?{request.query}" if request.query else ""
    headers = httpx.Headers(list(request.headers))
    if hold_id:
        headers["Idempotency-Key"] = upstream_key(hold_id)
        headers["X-Irrev-Hold"] = hold_id
    if request.content_type:
        headers["Content-Type"] = request.content_type
    for name, value in upstream.credentials:
        headers[name] = value
    started = time.perf_counter()
    try:
        async with asyncio.timeout(total_s):
            response = await client.request(
                request.method, url, content=request.body, headers=headers
            )
    except TimeoutError:
        return Answer(Fate.UNKNOWN, why="upstream_timeout", elapsed_s=time.perf_counter() - started)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        return Answer(Fate.NOT_SENT, why=_why(exc), elapsed_s=time.perf_counter() - started)
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        return Answer(Fate.UNKNOWN, why=_why(exc), elapsed_s=time.perf_counter() - started)
    kept = upstream.kept_headers
    return Answer(
        fate_of_status(response.status_code),
        response.status_code,
        tuple((k, v) for k, v in response.headers.multi_items() if k.lower() in kept),
        response.content,
        why=f"upstream_{response.status_code}",
        elapsed_s=time.perf_counter() - started,
    )


# RFC 3986 pchar minus '%' and ';', plus the separator: a decoded path (what was
# priced) goes out with every other character percent-encoded, so '?', '#', '%' or ';'
# in a path parameter stay part of that parameter and cannot turn into a query, a
# fragment, another escape or matrix parameters (which Tomcat strips), i.e. into a
# request other than the one priced.
_PATH_SAFE = "/!$&'()*+,=:@-._~"


def upstream_path(path: str) -> str:
    return quote(path, safe=_PATH_SAFE)


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
