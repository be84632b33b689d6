"""Every request body is bounded before anything reads it, on every route: FastAPI
read a route's body parameters before its authentication ran, so an
unauthenticated client could make a worker buffer a body of any size (the review's
200 MB POST to /v1/holds took a worker from 218 to 619 MB). Routes now read their
bodies once they know the caller; the bound and the deadline hold for the callers
they read them for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from .conftest import MAX_BODY_BYTES, Gateway, TenantMaker, own_gateway
from .helpers import assert_problem, trickled_request
from .servers import Server

# Bodies are bounded before anything reads them, so before Redis: the same on every server.
pytestmark = pytest.mark.server_neutral

MAX_POLICY_BYTES = 4 << 20  # the default IRREV_MAX_POLICY_BYTES


@pytest.fixture(scope="module")
def keys_path(new_tenant: TenantMaker) -> str:
    """An admin route that reads its body once the caller may act on it."""
    return f"/v1/admin/tenants/{new_tenant('bodies').id}/keys"


async def declared_only(base_url: str, method: str, target: str, length: int) -> bytes:
    """Headers declaring a `length`-byte body and none of it: the answer (read until
    the server closes: head and body may come in separate reads), or what came before
    10 s passed."""
    url = httpx.URL(base_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        head = (
            f"{method} {target} HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(reader.read(), timeout=10)
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("method", "target", "length"),
    [
        ("POST", "/v1/holds", 200 << 20),
        ("POST", "/v1/holds/h-1/post", MAX_BODY_BYTES + 1),
        ("PUT", "/v1/admin/tenants/anyone/policy", MAX_POLICY_BYTES + 1),
    ],
)
async def test_a_declared_body_over_the_bound_is_refused_unread(
    gateway: Gateway, method: str, target: str, length: int
) -> None:
    answer = await declared_only(gateway.url, method, target, length)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"body_too_large" in answer


@pytest.fixture(scope="module")
def patient_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """A gateway whose body deadline a loaded machine cannot reach: the shared one's
    1 s ran out on CI before a chunked body had passed the bound (the deadline starts
    with the request, before the route's role check), and a test of the bound got the
    deadline's 408 instead."""
    root = tmp_path_factory.mktemp("patient")
    settings = {"IRREV_BODY_TIMEOUT_S": "120", "IRREV_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    with own_gateway(redis_url, suppliers, root, 1, **settings) as gateway:
        yield gateway


async def test_a_chunked_body_is_cut_at_the_bound(patient_gateway: Gateway) -> None:
    """No Content-Length: an admin's body is counted as it arrives and refused once
    past the bound (the answer is read while sending: the server closes the
    connection on a body it will not read)."""
    gateway = patient_gateway
    keys_path = f"/v1/admin/tenants/{gateway.tenant('own').id}/keys"
    url = httpx.URL(gateway.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)

    async def answer_of() -> bytes:
        """The server's answer, read as it comes (it may close on the unread rest)."""
        data = b""
        with contextlib.suppress(ConnectionError):
            while not data.endswith(b"}"):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
        return data

    answering = asyncio.create_task(answer_of())
    try:
        head = (
            f"POST {keys_path} HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Authorization: {gateway.admin['Authorization']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(head.encode())
        chunk = b" " * (MAX_BODY_BYTES // 8)
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                if answering.done():
                    break
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            # The body's end: the refusal waits for it (or the deadline), so that the
            # client has finished sending when it goes out.
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        answer = await asyncio.wait_for(answering, timeout=10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"body_too_large" in answer


async def test_a_body_within_the_bound_still_reaches_the_route(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post(
        "/v1/holds", content=b"{}", headers={"Content-Type": "application/json"}
    )
    assert_problem(response, 401, "unauthenticated")


async def test_an_admins_trickled_body_is_cut_at_the_deadline(
    gateway: Gateway, keys_path: str
) -> None:
    """IRREV_BODY_TIMEOUT_S holds on the admin API too: a slow client, even one with a
    token, cannot hold a worker there either."""
    body = b'{"note": "' + b"x" * 200 + b'"}'
    headers = {"Content-Type": "application/json", **gateway.admin}
    status, problem = await trickled_request(gateway.url, keys_path, headers, body)
    assert (status, problem["reason"]) == (408, "body_timeout")


@pytest.mark.parametrize("target", ["/v1/holds", "/v1/holds/h-1/post"])
async def test_the_decision_api_refuses_a_stranger_before_reading_its_body(
    gateway: Gateway, target: str
) -> None:
    """The decision API reads a body once it knows whose it is: a trickled one without
    a token is answered 401 while it is still being sent, not cut at the deadline."""
    body = b'{"note": "' + b"x" * 200 + b'"}'
    headers = {"Content-Type": "application/json"}
    status, problem = await trickled_request(gateway.url, target, headers, body)
    assert (status, problem["reason"]) == (401, "unauthenticated")
