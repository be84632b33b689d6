"""IRREV_WAIT_REPLICAS: an admission no replica acknowledged is released before
anything is sent, and the agent gets 503 not_replicated. A real primary and replica
(redis-server processes), and the session's local Redis Cluster (3 primaries, 3
replicas); the replica is SIGKILLed mid-test and brought back."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import httpx
import pytest

from irrev.client import IrrevClient
from irrev.localcluster import LocalCluster
from ledger.keys import accounts_key

from ..conftest import ReplicatedRedis
from .conftest import Gateway, own_gateway
from .helpers import (
    assert_problem,
    balances,
    deploy_hold,
    effect_headers,
    ledger_audit,
    order,
    orders_made,
    send_order,
    used,
)
from .servers import Server

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow


@pytest.fixture
def replicated_gateway(
    replicated_redis: ReplicatedRedis, suppliers: Server, tmp_path: Path
) -> Iterator[Gateway]:
    with waiting_gateway(replicated_redis.primary.url, suppliers, tmp_path) as gateway:
        yield gateway


@pytest.fixture
def cluster_gateway(
    redis_cluster: LocalCluster, suppliers: Server, tmp_path: Path
) -> Iterator[Gateway]:
    with waiting_gateway(redis_cluster.url, suppliers, tmp_path) as gateway:
        yield gateway


def waiting_gateway(url: str, suppliers: Server, tmp_path: Path) -> ContextManager[Gateway]:
    return own_gateway(
        url, suppliers, tmp_path, 1, IRREV_WAIT_REPLICAS="1", IRREV_WAIT_TIMEOUT_MS="300"
    )


async def test_unreplicated_admission_is_released_and_never_sent(
    replicated_gateway: Gateway, replicated_redis: ReplicatedRedis, upstream: httpx.AsyncClient
) -> None:
    await unreplicated_admissions(
        replicated_gateway, upstream, replicated_redis.replica.kill, replicated_redis.attach
    )
    audit = ledger_audit(replicated_redis.primary.url, replicated_gateway.tenant("own"))
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_on_a_cluster_the_replica_of_the_tenants_primary_is_the_one_waited_for(
    cluster_gateway: Gateway, redis_cluster: LocalCluster, upstream: httpx.AsyncClient
) -> None:
    """The tenant's primary's replica stopped, every other primary's replica up: a
    WAIT anywhere but on the connection that ran the script would be acknowledged."""
    tenant = cluster_gateway.tenant("own")
    (replica,) = redis_cluster.replicas_of(redis_cluster.primary_for(accounts_key(tenant.id)))

    def restore() -> None:
        replica.start()
        redis_cluster.wait_healthy()

    try:
        await unreplicated_admissions(cluster_gateway, upstream, replica.stop, restore)
    finally:
        if not replica.answers():
            await asyncio.to_thread(restore)
    audit = ledger_audit(redis_cluster.url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def unreplicated_admissions(
    gateway: Gateway,
    upstream: httpx.AsyncClient,
    stop_replica: Callable[[], None],
    restore_replica: Callable[[], None],
) -> None:
    tenant = gateway.tenant("own")
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
        assert (await send_order(http, tenant, "o1")).status_code == 201
        assert await orders_made(upstream, tenant) == 1
        # Above the approval threshold:
        escalated = await send_order(http, tenant, "big", quantity=450)
        assert escalated.status_code == 202, escalated.text
        location = escalated.headers["location"]
        before = used(await balances(http, gateway.admin, tenant))

        await asyncio.to_thread(stop_replica)
        refused = assert_problem(await send_order(http, tenant, "o2"), 503, "not_replicated")
        assert (refused["replicas"], refused["wanted"]) == (0, 1)
        assert await orders_made(upstream, tenant) == 1  # nothing was sent
        assert used(await balances(http, gateway.admin, tenant)) == before  # released
        again = await send_order(http, tenant, "o2")  # a repeat of the key gets the same answer
        assert_problem(again, 503, "not_replicated")
        assert again.headers["x-irrev-replayed"] == "true"
        assert again.headers["x-irrev-hold"] == refused["hold"]
        # As the first answer, a refusal: not the released hold's 'admit' and the price
        # of an effect that was never made (failed before: x-irrev-decision admit).
        decided = {"x-irrev-decision", "x-irrev-price", "x-irrev-remaining"}
        assert not decided & again.headers.keys(), dict(again.headers)
        # The gateway's, as the first was (the kept answer had lost X-Irrev-Reason, so
        # the client took it for the tool's own 503: "the effect may have happened").
        assert again.headers["x-irrev-reason"] == "not_replicated"
        client = IrrevClient(gateway.url, tenant.tokens["buyer-01"], pause_s=0.2)
        try:
            told = await client.call("supplier", "POST", "/orders", "o2", json_body=order())
        finally:
            await client.aclose()
        assert told.reason == "not_replicated" and told.status == 503, told
        assert told.text.startswith("The supplier call was not made (not_replicated)")

        async def decide() -> httpx.Response:
            return await http.post(
                "/v1/holds",
                json={"tool": "deploy", "method": "POST", "path": "/deploys"},
                headers=effect_headers(tenant, "deployer-01", "d1"),
            )

        assert_problem(await decide(), 503, "not_replicated")
        # A repeat on the decision API too: the refusal, never a 200 with the released
        # hold's 'admit' that an in-process tool would act on (failed before: 200).
        again = await decide()
        assert_problem(again, 503, "not_replicated")
        assert again.headers["x-irrev-replayed"] == "true"
        assert not decided & again.headers.keys(), dict(again.headers)
        approved = await http.post(f"{location}/approve", headers=gateway.admin)
        assert_problem(approved, 503, "not_replicated")
        assert await orders_made(upstream, tenant) == 1
        poll = await http.get(location, headers=tenant.auth("buyer-01"))
        assert_problem(poll, 503, "not_replicated")
        assert poll.headers["x-irrev-reason"] == "not_replicated"
        escalation_price = int(escalated.headers["x-irrev-price"])
        after = used(await balances(http, gateway.admin, tenant))
        assert after[f"tenant:{tenant.id}"] == before[f"tenant:{tenant.id}"] - escalation_price

        await asyncio.to_thread(restore_replica)
    # A new connection: the restore (a cluster's health waited for) may outlast the
    # gateway's keep-alive (uvicorn's 5 s), and a request on the connection it closed
    # meanwhile fails to read (httpx.ReadError), whatever the gateway would answer.
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
        assert (await send_order(http, tenant, "o3")).status_code == 201
        assert await orders_made(upstream, tenant) == 2


async def test_a_settlement_no_replica_acknowledged_is_refused_until_repeated(
    replicated_gateway: Gateway, replicated_redis: ReplicatedRedis
) -> None:
    """A settler's post (and a settle) while the replica is stopped (SIGSTOP, a
    partition): 503 not_replicated, yet posted on the primary (the effect happened:
    nothing is undone) and counted; once the replica is back the same request is
    answered 200 with the same posted hold (failed before: 200 while unreplicated)."""
    tenant = replicated_gateway.tenant("own")
    settler, replica_pid = tenant.settler("deploy"), replicated_redis.replica.pid
    series = 'irrev_unacknowledged_writes_total{op="post"}'
    async with httpx.AsyncClient(
        base_url=replicated_gateway.url, trust_env=False, timeout=30
    ) as http:
        posted_hold, _ = await deploy_hold(http, tenant, "d1")
        settled_hold, _ = await deploy_hold(http, tenant, "d2")
        requests = [
            (f"/v1/holds/{posted_hold}/post", {}),
            (f"/v1/holds/{settled_hold}/settle", {"realised_micros": 0}),
        ]
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            for path, body in requests:
                refused = await http.post(path, json=body, headers=settler)
                problem = assert_problem(refused, 503, "not_replicated")
                assert (problem["replicas"], problem["wanted"]) == (0, 1)
                assert "repeat the same request" in problem["detail"]
            states = [
                (await http.get(f"/v1/holds/{hold}", headers=settler)).json()
                for hold in (posted_hold, settled_hold)
            ]
            assert [s["state"] for s in states] == ["posted", "posted"]
            # A repeat while the replica is still stopped is refused too.
            path, body = requests[0]
            assert_problem(await http.post(path, json=body, headers=settler), 503, "not_replicated")
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        for path, body in requests:
            repeated = await http.post(path, json=body, headers=settler)
            assert repeated.status_code == 200, repeated.text
            assert repeated.json()["state"] == "posted"
        after = [
            (await http.get(f"/v1/holds/{hold}", headers=settler)).json()
            for hold in (posted_hold, settled_hold)
        ]
        assert after == states
        metrics = (await http.get("/metrics", headers=replicated_gateway.admin)).text
    assert f"{series} 3.0" in metrics, metrics
