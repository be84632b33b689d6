"""An agent's repeat of an effect whose hold was settled and then archived out of the
tenant's Redis slot (IRREV_ARCHIVE_AFTER_S, ledger/archive.py) gets what a repeat
always gets: the kept answer, marked as a replay, and no second effect at the tool;
with an Idempotency-Key and without one (a route keyed by content)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx

from ledger.cluster import redis_client
from ledger.keys import settled_key

from .conftest import own_gateway
from .helpers import order, supplier_stats
from .procurement import keyless_orders
from .servers import Server, Tenant


async def archived(redis_url: str, tenant: Tenant, hold: str, deadline_s: float = 30.0) -> None:
    """Wait until the gateway's sweeper has archived `hold`."""
    redis = redis_client(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + deadline_s
        while not await redis.hexists(settled_key(tenant.id), hold):
            assert time.monotonic() < deadline, f"hold {hold} not archived in {deadline_s} s"
            await asyncio.sleep(0.1)
    finally:
        await redis.aclose()


async def test_repeats_of_archived_effects_are_replays(
    redis_url: str, suppliers: Server, upstream: httpx.AsyncClient, tmp_path: Path
) -> None:
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path,
        1,
        keyless_orders(),
        IRREV_ARCHIVE_AFTER_S="0",
        IRREV_SWEEP_INTERVAL_S="0.2",
    ) as gateway:
        tenant = gateway.tenant("own")
        keyed = {**tenant.auth("buyer-01"), "Idempotency-Key": f"k-{uuid.uuid4().hex[:8]}"}
        keyless = tenant.auth("buyer-02")
        body = order(quantity=2, sku=f"sku-{uuid.uuid4().hex[:8]}")
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
            firsts = [
                await http.post("/tools/supplier/orders", json=order(), headers=keyed),
                await http.post("/tools/supplier/orders", json=body, headers=keyless),
            ]
            assert [r.status_code for r in firsts] == [201, 201], [r.text for r in firsts]
            holds = [r.headers["X-Irrev-Hold"] for r in firsts]
            for hold in holds:
                await archived(redis_url, tenant, hold)
            made = (await supplier_stats(upstream, tenant))["requests"]
            agains = [
                await http.post("/tools/supplier/orders", json=order(), headers=keyed),
                await http.post("/tools/supplier/orders", json=body, headers=keyless),
            ]
            for first, again in zip(firsts, agains, strict=True):
                assert again.status_code == 201, again.text
                assert again.headers["X-Irrev-Replayed"] == "true"
                assert again.headers["X-Irrev-Hold"] == first.headers["X-Irrev-Hold"]
                assert again.json() == first.json()
            assert (await supplier_stats(upstream, tenant))["requests"] == made
            for hold, agent in zip(holds, ("buyer-01", "buyer-02"), strict=True):
                shown = await http.get(f"/v1/holds/{hold}", headers=tenant.auth(agent))
                assert shown.status_code == 200 and shown.json()["state"] == "posted"
