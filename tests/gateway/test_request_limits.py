"""A refused request costs less than the request (issue 26): bodies past the tenant's
`request_limits` (values, string length) are refused on their bytes or while they are
parsed, before anything is priced or held; one agent's requests in flight at a worker
are bounded, and its tenant's other agents are served meanwhile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.edge.canonical import parse_form
from gateway.edge.problems import Problem
from gateway.edge.wire import parse_json_body
from pricing.policy import RequestLimits

from .conftest import Gateway, own_gateway
from .helpers import (
    assert_problem,
    balances,
    effect_headers,
    order,
    set_faults,
    trickled_request,
    used,
)
from .servers import Server

SMALL = RequestLimits(max_values=100, max_string_length=1000, max_in_flight=2)


def refused(body: bytes, limits: RequestLimits = SMALL) -> str:
    try:
        parse_json_body(body, limits)
    except Problem as problem:
        return f"{problem.status} {problem.reason}"
    return "parsed"


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        (json.dumps({f"k{i}": i for i in range(60)}).encode(), "413 body_too_complex"),
        (json.dumps({f"k{i}": i for i in range(40)}).encode(), "parsed"),
        (json.dumps([[1] * 30] * 3).encode(), "parsed"),
        (json.dumps([[1] * 40] * 3).encode(), "413 body_too_complex"),
        (json.dumps({"note": "x" * 1001}).encode(), "413 body_too_complex"),
        (json.dumps({"x" * 1001: 1}).encode(), "413 body_too_complex"),
        (json.dumps({"note": "x" * 1000}).encode(), "parsed"),
        (b"[" * 33 + b"]" * 33, "400 bad_json"),
        (b"[" * 32 + b"1" + b"]" * 32, "parsed"),
        (b"[" * 100_000 + b"]" * 100_000, "400 bad_json"),
        (b'{"a": "\\ud800"}', "400 bad_json"),
    ],
    ids=[
        "keys",
        "keys-within",
        "items-within",
        "items",
        "string",
        "key-length",
        "string-within",
        "depth",
        "depth-within",
        "deep",
        "surrogate",
    ],
)
def test_json_bodies_past_the_limits_are_refused(body: bytes, answer: str) -> None:
    assert refused(body) == answer


def test_a_form_past_the_limits_is_refused() -> None:
    with pytest.raises(Problem) as fields:
        parse_form("&".join(f"f{i}=1" for i in range(101)).encode(), SMALL)
    assert fields.value.reason == "body_too_complex"
    with pytest.raises(Problem) as value:
        parse_form(b"note=" + b"x" * 1001, SMALL)
    assert value.value.reason == "body_too_complex"
    assert parse_form(b"note=" + b"x" * 1000, SMALL) == {"note": "x" * 1000}


@pytest.fixture(scope="module")
def limited(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("limits")
    limits = {
        "max_body_bytes": 4096,
        "max_values": 100,
        "max_string_length": 1000,
        "max_in_flight": 2,
    }
    with own_gateway(
        redis_url, suppliers, root, 1, {"request_limits": limits}, IRREV_UPSTREAM_TIMEOUT_S="5"
    ) as gateway:
        yield gateway


@pytest.fixture
async def client(limited: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=limited.url, timeout=30, trust_env=False) as c:
        yield c


async def test_a_heavy_body_is_refused_before_anything_is_held(
    limited: Gateway, client: httpx.AsyncClient
) -> None:
    tenant = limited.tenant("own")
    before = used(await balances(client, limited.admin, tenant))
    long_string = {**order(), "note": "x" * 2000}
    response = await client.post(
        "/tools/supplier/orders", json=long_string, headers=effect_headers(tenant, "buyer-01", "h1")
    )
    problem = assert_problem(response, 413, "body_too_complex")
    assert problem["retry"] == "fix"
    heavy = {**order(), "note": "x" * 100_000}
    response = await client.post(
        "/tools/supplier/orders", json=heavy, headers=effect_headers(tenant, "buyer-01", "h2")
    )
    assert "4096 bytes" in assert_problem(response, 413, "body_too_large")["detail"]
    assert used(await balances(client, limited.admin, tenant)) == before


async def test_an_agents_requests_in_flight_are_bounded_and_others_are_served(
    limited: Gateway, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = limited.tenant("own")
    await set_faults(upstream, tenant, hold=True, times=2)
    try:
        held = [
            asyncio.create_task(
                client.post(
                    "/tools/supplier/orders",
                    json=order(quantity=1, sku=f"held-{i}"),
                    headers=effect_headers(tenant, "buyer-02", f"held-{i}"),
                )
            )
            for i in range(2)
        ]
        deadline = asyncio.get_running_loop().time() + 10
        while (await upstream.get(f"/{tenant.id}/_stats")).json()["requests"] < 2:
            assert asyncio.get_running_loop().time() < deadline, "the held orders never arrived"
        third = await client.post(
            "/tools/supplier/orders",
            json=order(quantity=1, sku="third"),
            headers=effect_headers(tenant, "buyer-02", "third"),
        )
        problem = assert_problem(third, 429, "too_many_in_flight")
        assert third.headers["retry-after"] == "1" and problem["retry"] == "later"
        other = await client.post(
            "/tools/supplier/orders",
            json=order(quantity=1, sku="other"),
            headers=effect_headers(tenant, "buyer-03", "other"),
        )
        assert other.status_code == 201, other.text
    finally:
        await upstream.post(f"/{tenant.id}/_release")
    assert [r.status_code for r in await asyncio.gather(*held)] == [201, 201]
    again = await client.post(
        "/tools/supplier/orders",
        json=order(quantity=1, sku="third"),
        headers=effect_headers(tenant, "buyer-02", "third"),
    )
    assert again.status_code == 201, again.text


async def test_a_decision_api_body_being_read_holds_its_agents_slot(
    limited: Gateway, client: httpx.AsyncClient
) -> None:
    """The decision API takes the agent's slot before it reads the body, as the proxy
    does: two bodies trickling in are the agent's two requests in flight, and its third
    is refused unread while its tenant's other agents are served."""
    tenant = limited.tenant("own")
    headers = {**tenant.auth("deployer-01"), "Content-Type": "application/json"}
    body = json.dumps({"tool": "deploy", "method": "POST", "path": "/deploys"}).encode()
    trickling = [
        asyncio.create_task(trickled_request(limited.url, "/v1/holds", headers, body))
        for _ in range(2)
    ]
    try:
        deadline = asyncio.get_running_loop().time() + 3
        while True:
            third = await client.post("/v1/holds/h-x/post", json={}, headers=headers)
            if third.status_code == 429 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert_problem(third, 429, "too_many_in_flight")
        other = await client.post("/v1/holds/h-x/post", json={}, headers=tenant.auth("buyer-01"))
        assert_problem(other, 404, "not_found")
    finally:
        answers = await asyncio.gather(*trickling)
    assert [reason["reason"] for _, reason in answers] == ["body_timeout"] * 2
