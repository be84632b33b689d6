"""/readyz while Redis refuses writes (issue 26): it said ready, and a load balancer
kept sending effects to a gateway that could only answer `ledger_unavailable`. A real
write probe (a key of irrev's namespace that expires, no tenant's) now tells it: 503
while the ledger's Redis refuses writes, ready again once it takes them. Here a
private redis-server of the test's own refuses them as a full one does (`maxmemory`
reached under `noeviction`) and as a primary demoted to a replica does (read-only).
On a Redis Cluster whose one primary refuses them, "degraded" but 200: every gateway
shares that primary, and the tenants of the others' slots are served."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from irrev.harness import free_port
from irrev.localcluster import LocalCluster
from ledger import EmbeddedRedis
from ledger.keys import accounts_key

from .conftest import Gateway, own_gateway
from .helpers import assert_problem, effect_headers, order
from .servers import Server

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

READY_DEADLINE_S = 20.0


@pytest.fixture
def private_redis(redis_binary: Path, tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path / "redis", binary=redis_binary, tcp=True) as server:
        yield server


def readiness_becomes(
    gateway: Gateway, status: int, also: Callable[[httpx.Response], bool] = lambda _: True
) -> httpx.Response:
    """/readyz once it answers `status` and `also` holds (polled), within
    READY_DEADLINE_S."""
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        answer = httpx.get(f"{gateway.url}/readyz", timeout=5, trust_env=False)
        if answer.status_code == status and also(answer):
            return answer
        assert time.monotonic() < deadline, f"/readyz stayed {answer.status_code}: {answer.text}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("refuse", "accept", "said"),
    [
        pytest.param(
            [
                ("CONFIG", "SET", "maxmemory-policy", "noeviction"),
                ("CONFIG", "SET", "maxmemory", "1"),
            ],
            [("CONFIG", "SET", "maxmemory", "0")],
            "out of memory",
            id="maxmemory-noeviction",
        ),
        pytest.param(
            # A primary demoted to a replica of a primary it cannot reach (yet): it keeps
            # its data and answers reads, and refuses every write.
            [("REPLICAOF", "127.0.0.1", str(free_port()))],
            [("REPLICAOF", "NO", "ONE")],
            "read-only replica",
            id="read-only-replica",
        ),
    ],
)
def test_readyz_is_503_while_redis_refuses_writes(
    refuse: list[tuple[str, ...]],
    accept: list[tuple[str, ...]],
    said: str,
    private_redis: EmbeddedRedis,
    suppliers: Server,
    tmp_path: Path,
) -> None:
    with (
        own_gateway(private_redis.url, suppliers, tmp_path, 2) as gateway,
        redis.Redis.from_url(private_redis.url) as admin,
    ):
        tenant = gateway.tenant("own")
        assert readiness_becomes(gateway, 200).json() == {"status": "ready"}
        for command in refuse:
            admin.execute_command(*command)
        try:
            assert admin.ping()  # reachable all along: a PING does not tell
            refused = readiness_becomes(gateway, 503)
            body = assert_problem(refused, 503, "ledger_unavailable")
            assert said in body["detail"] and "probe" in body["detail"], body
            assert refused.headers["retry-after"] == "1"
            # What a load balancer keeps away from it: effects it can only refuse.
            effect = httpx.post(
                f"{gateway.url}/tools/supplier/orders",
                json=order(),
                headers=effect_headers(tenant, "buyer-01", "refused-" + said.replace(" ", "-")),
                timeout=10,
                trust_env=False,
            )
            assert_problem(effect, 503, "ledger_unavailable")
        finally:
            for command in accept:
                admin.execute_command(*command)
        assert readiness_becomes(gateway, 200).json() == {"status": "ready"}
        admitted = httpx.post(
            f"{gateway.url}/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "buyer-01", "admitted-" + said.replace(" ", "-")),
            timeout=10,
            trust_env=False,
        )
        assert admitted.status_code == 201, admitted.text
        # The probe wrote only its own key, in irrev's namespace, never a tenant's.
        probes = [k.decode() for k in admin.scan_iter(match="irrev:probe:*")]
        assert probes == ["irrev:probe:{0}"], probes


def test_on_a_cluster_one_primary_refusing_writes_degrades_but_keeps_it_ready(
    redis_cluster: LocalCluster, suppliers: Server, tmp_path: Path
) -> None:
    with own_gateway(redis_cluster.url, suppliers, tmp_path, 1) as gateway:
        tenant = gateway.tenant("own")
        primaries = {redis_cluster.primary_for(f"irrev:probe:{{{n}}}").port for n in range(64)}
        assert len(primaries) > 1
        full = redis_cluster.primary_for(accounts_key(tenant.id))
        with full.client() as node:
            node.config_set("maxmemory", "1")
            try:
                degraded = readiness_becomes(gateway, 200, lambda a: a.json()["status"] != "ready")
                assert degraded.json() == {"status": "degraded", "primaries_refusing_writes": 1}
                operator = httpx.get(
                    f"{gateway.url}/readyz",
                    headers=gateway.admin,
                    timeout=5,
                    trust_env=False,
                ).json()
                [refusal] = operator["write_refusals"]
                assert "out of memory" in refusal, refusal
                # The tenant whose slot is on that primary is refused; the gateway is not
                # taken out for the others.
                effect = httpx.post(
                    f"{gateway.url}/tools/supplier/orders",
                    json=order(),
                    headers=effect_headers(tenant, "buyer-01", "on-a-full-primary"),
                    timeout=10,
                    trust_env=False,
                )
                assert_problem(effect, 503, "ledger_unavailable")
            finally:
                node.config_set("maxmemory", "0")
        readiness_becomes(gateway, 200, lambda a: a.json() == {"status": "ready"})
