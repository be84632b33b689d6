"""Request rates through a real gateway (issue 26): a principal's effect rate is
checked in the reserve, its read rate in one Redis call per read; past them, 429
rate_limited with Retry-After, nothing held or sent, and another principal's agents
are not slowed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from .conftest import Gateway, own_gateway
from .helpers import assert_problem, effect_headers, order, orders_made
from .servers import EXAMPLES, Server


@pytest.fixture(scope="module")
def paced(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    accounts = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())["accounts"]
    # Slow enough that a test's requests all fall within one burst's refill.
    accounts["principals"]["procurement"]["rate_limits"] = {
        "effects": {"per_second": 0.05, "burst": 2},
        "reads": {"per_second": 0.05, "burst": 1},
    }
    root: Path = tmp_path_factory.mktemp("paced")
    with own_gateway(redis_url, suppliers, root, 2, {"accounts": accounts}) as gateway:
        yield gateway


@pytest.fixture
async def client(paced: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=paced.url, timeout=30, trust_env=False) as c:
        yield c


async def test_a_principals_effects_past_its_burst_are_refused(
    paced: Gateway, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = paced.tenant("own")
    answers = [
        await client.post(
            "/tools/supplier/orders",
            json=order(quantity=1, sku=f"r{i}"),
            headers=effect_headers(tenant, agent, f"rate-{i}"),
        )
        for i, agent in enumerate(("buyer-01", "buyer-02", "buyer-03"))
    ]
    assert [a.status_code for a in answers[:2]] == [201, 201]
    problem = assert_problem(answers[2], 429, "rate_limited")
    assert problem["account"] == "principal:procurement" and problem["retry"] == "later"
    assert int(answers[2].headers["retry-after"]) >= 1
    assert await orders_made(upstream, tenant) == 2
    # Another principal's agent has a rate of its own (none here).
    other = await client.post(
        "/tools/supplier/orders",
        json=order(quantity=1, sku="facilities"),
        headers=effect_headers(tenant, "buyer-41", "rate-f"),
    )
    assert other.status_code == 201, other.text


async def test_reads_have_a_rate_of_their_own(paced: Gateway, client: httpx.AsyncClient) -> None:
    tenant = paced.tenant("own")
    first = await client.get("/tools/supplier/catalog", headers=tenant.auth("buyer-04"))
    assert first.status_code == 200, first.text
    second = await client.get("/tools/supplier/catalog", headers=tenant.auth("buyer-05"))
    assert_problem(second, 429, "rate_limited")
