"""A settlement the ledger refused while the tenant's cluster slot moved past the
migration wait (IRREV_MIGRATION_WAIT_S) is written by the gateway once the slot is
served again: the gateway's own retries leave no hold pending whose outcome it
knew (gateway/pipeline/resettle.py). On the local Redis Cluster, whose slot a test can hold
mid-migration."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from irrev.localcluster import LocalCluster
from ledger.keys import accounts_key

from .conftest import own_gateway
from .helpers import effect_headers, order, set_faults, supplier_stats
from .servers import Server

STUCK_S = 3.0  # past the gateway's 1 s migration wait, more than once


async def test_a_settlement_a_stuck_migration_refused_is_written_after_it(
    redis_cluster: LocalCluster, suppliers: Server, upstream: httpx.AsyncClient, tmp_path: Path
) -> None:
    with own_gateway(
        redis_cluster.url, suppliers, tmp_path, 1, IRREV_MIGRATION_WAIT_S="1"
    ) as gateway:
        tenant = gateway.tenant("own")
        await set_faults(upstream, tenant, hold=True, times=1)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60, trust_env=False) as http:
            sent = asyncio.create_task(
                http.post(
                    "/tools/supplier/orders",
                    json=order(),
                    headers=effect_headers(tenant, "buyer-01", "moving"),
                )
            )
            while (await supplier_stats(upstream, tenant))["requests"] == 0:
                await asyncio.sleep(0.02)
            # Admitted and at the tool: now the slot starts a move that does not end.
            with redis_cluster.stuck_migration(accounts_key(tenant.id)):
                assert (await upstream.post(f"/{tenant.id}/_release")).status_code == 200
                answer = await sent  # the tool's answer; its post waits, then fails
                await asyncio.sleep(STUCK_S)
            assert answer.status_code == 201, answer.text
            hold = answer.headers["x-irrev-hold"]
            deadline = time.monotonic() + 30
            state = ""
            while time.monotonic() < deadline:
                shown = await http.get(f"/v1/holds/{hold}", headers=tenant.auth("buyer-01"))
                state = shown.json()["state"]
                if state == "posted":
                    break
                await asyncio.sleep(0.2)
            assert state == "posted", gateway.server.log()[-3000:]
    log = (tmp_path / "gateway.log").read_text()
    assert "settlement not written; trying again" in log and "settled later" in log
