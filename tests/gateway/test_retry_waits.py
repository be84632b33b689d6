"""The retry of an ambiguous hold waits as an admission does (IRREV_WAIT_REPLICAS,
IRREV_WAIT_AOF): its claim is followed by WAIT / WAITAOF, which also counts the
reserve written before it on the same primary, and a claim acknowledged short is not
sent: the hold stays ambiguous and charged (the first send may have made the effect)
and the agent is told 503 to repeat the same key later. Else a failover to a replica
that never had the debit would lose the charge of an effect that was forwarded.

A real `irrev serve` on a real primary and replica: the gateway is SIGKILLed while
the admission's wait waits for a replica that is SIGSTOPped (a partition), so the
hold is left pending, unacknowledged and never sent. The reviewer's reproduction
(its repeat was forwarded at once, its debit on no replica, lost in the failover)
failed here before the retry waited."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis

from ledger import HoldState
from ledger.client import Ledger
from ledger.keys import deadlines_key

from ..conftest import ReplicatedRedis
from .conftest import Gateway, own_gateway, wait_for_workers
from .helpers import (
    assert_problem,
    balances,
    ledger_audit,
    orders_made,
    send_order,
    used,
)
from .servers import Server

# Slow (a primary and a replica, a gateway SIGKILLed and started again, waits of
# seconds): .ci/run runs it, README's test command does not.
pytestmark = pytest.mark.slow


async def test_a_retry_no_replica_acknowledged_is_not_sent(
    replicated_redis: ReplicatedRedis,
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """IRREV_WAIT_REPLICAS=1 (WAIT 1)."""
    waits = {"IRREV_WAIT_REPLICAS": "1"}
    await unacknowledged_retry(replicated_redis, waits, suppliers, upstream, tmp_path)


async def test_a_retry_no_replica_fsynced_is_not_sent(
    replicated_valkey: ReplicatedRedis,
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """IRREV_WAIT_AOF=all (WAITAOF 1 1)."""
    waits = {"IRREV_WAIT_AOF": "all", "IRREV_WAIT_REPLICAS": "1"}
    await unacknowledged_retry(replicated_valkey, waits, suppliers, upstream, tmp_path)


async def unacknowledged_retry(
    replicated: ReplicatedRedis,
    waits: dict[str, str],
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    url = replicated.primary.url
    # A replica reports its AOF fsyncs about once a second: WAITAOF 1 1 needs longer.
    settings = {**waits, "IRREV_WAIT_TIMEOUT_MS": "1500"}
    with own_gateway(url, suppliers, tmp_path, 1, **settings) as gateway:
        tenant = gateway.tenant("own")
        async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
            assert (await send_order(http, tenant, "o1")).status_code == 201
            with redis.Redis.from_url(replicated.replica.url) as client:
                replica_pid = int(client.info("server")["process_id"])
            os.kill(replica_pid, signal.SIGSTOP)
            ledger = Ledger.from_url(url)
            try:
                first = asyncio.create_task(send_order(http, tenant, "o2"))
                hold_id = await _pending_hold(url, tenant.id)
                _crash(gateway)  # while the admission's wait waits for the replica
                with pytest.raises(httpx.HTTPError):
                    await first
                assert await orders_made(upstream, tenant) == 1
                gateway.server.start("/readyz")
                wait_for_workers(gateway, workers=1)
                # At the hold's deadline the sweeper marks it ambiguous (the crash may
                # have sent it); the test does so at once rather than wait for the dead
                # gateway's sweep lease to lapse.
                await ledger.mark_ambiguous(tenant.id, hold_id, "gateway_crash")
                charged = used(await balances(http, gateway.admin, tenant))
                for _ in range(2):  # each repeat claims, waits, is short, ends its claim
                    refused = assert_problem(
                        await send_order(http, tenant, "o2"), 503, "not_replicated"
                    )
                    assert refused["hold"] == hold_id
                    assert "same Idempotency-Key" in refused["detail"]
                assert await orders_made(upstream, tenant) == 1  # never sent again
                assert used(await balances(http, gateway.admin, tenant)) == charged
                # Refused, a short claim puts nothing at risk: not counted as a write
                # acknowledged without its wait (posts and true-ups are).
                assert 'op="retry"' not in (await http.get("/metrics")).text
                hold = await ledger.hold(tenant.id, hold_id)
                assert hold is not None and hold.state is HoldState.AMBIGUOUS
            finally:
                os.kill(replica_pid, signal.SIGCONT)
                await ledger.aclose()
            # Once the replica is back a repeat is sent, once.
            for _ in range(20):
                again = await send_order(http, tenant, "o2")
                if again.status_code != 503:
                    break
                assert await orders_made(upstream, tenant) == 1
                await asyncio.sleep(0.5)
            assert again.status_code == 201, again.text
            assert (await send_order(http, tenant, "o2")).status_code == 201
            assert await orders_made(upstream, tenant) == 2
        audit = ledger_audit(url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def _pending_hold(url: str, tenant: str, deadline_s: float = 30.0) -> str:
    """The id of the tenant's one pending hold, once its reserve has run."""
    deadline = time.monotonic() + deadline_s
    with redis.Redis.from_url(url, decode_responses=True) as client:
        while not (pending := client.zrange(deadlines_key(tenant), 0, -1)):
            assert time.monotonic() < deadline, "the reserve never ran"
            await asyncio.sleep(0.01)
    (hold_id,) = pending
    return str(hold_id)


def _crash(gateway: Gateway) -> None:
    for pid in gateway.worker_pids():
        os.kill(pid, signal.SIGKILL)
    gateway.server.kill()
