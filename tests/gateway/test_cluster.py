"""`irrev serve` on a Redis Cluster (the session's local 3 primaries + 3 replicas,
tests/cluster.py): it starts with the example policy given one node's URL, admits
and forwards, and with IRREV_WAIT_REPLICAS an admission the replica of the tenant's
primary did not acknowledge (that replica stopped; the other primaries' replicas
up) is released and answered 503 not_replicated, never sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ledger.keys import accounts_key

from ..cluster import LocalCluster
from .conftest import Gateway, own_gateway
from .helpers import assert_problem, balances, effect_headers, ledger_audit, order, used
from .servers import Server


@pytest.fixture
def cluster_gateway(
    redis_cluster: LocalCluster, suppliers: Server, tmp_path: Path
) -> Iterator[Gateway]:
    with own_gateway(
        redis_cluster.url,
        suppliers,
        tmp_path,
        workers=2,
        IRREV_WAIT_REPLICAS="1",
        IRREV_WAIT_TIMEOUT_MS="300",
    ) as gateway:
        yield gateway


async def test_a_gateway_on_a_cluster_admits_and_never_acts_on_an_unreplicated_hold(
    cluster_gateway: Gateway, redis_cluster: LocalCluster, upstream: httpx.AsyncClient
) -> None:
    gateway = cluster_gateway
    tenant = gateway.tenant("own")
    (replica,) = redis_cluster.replicas_of(redis_cluster.primary_for(accounts_key(tenant.id)))
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:

        async def send(key: str) -> httpx.Response:
            return await http.post(
                "/tools/supplier/orders",
                json=order(quantity=10),
                headers=effect_headers(tenant, "buyer-01", key),
            )

        async def orders() -> int:
            stats = (await upstream.get(f"/{tenant.id}/_stats")).json()
            return int(stats["orders"])

        assert (await send("o1")).status_code == 201
        assert await orders() == 1
        before = used(await balances(http, gateway.admin, tenant))

        await asyncio.to_thread(replica.stop)
        try:
            refused = assert_problem(await send("o2"), 503, "not_replicated")
            assert (refused["replicas"], refused["wanted"]) == (0, 1)
            assert await orders() == 1  # nothing was sent
            assert used(await balances(http, gateway.admin, tenant)) == before  # released
        finally:
            await asyncio.to_thread(replica.start)
            await asyncio.to_thread(redis_cluster.wait_healthy)
        assert (await send("o3")).status_code == 201
        assert await orders() == 2

    audit = ledger_audit(redis_cluster.url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "ok" in audit.stdout
