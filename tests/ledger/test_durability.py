"""Durability with `appendfsync always`: every acknowledged reserve survives a kill -9
of redis-server, including while other reserves are in flight."""

from __future__ import annotations

import asyncio

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.embedded import EmbeddedRedis
from ledger.errors import LedgerUnavailable
from ledger.records import HoldState

from .conftest import open_accounts

HOUR_MS = 3_600_000


async def test_acknowledged_reserves_survive_kill_9(
    redis_server: EmbeddedRedis, tenant: str
) -> None:
    assert redis_server.appendfsync == "always"
    writer = Ledger.from_url(redis_server.url)
    await open_accounts(writer, tenant, tenant_acme=10**12)
    acknowledged: list[str] = []
    enough = asyncio.Event()

    async def reserve_forever(lane: int) -> None:
        for i in range(100_000):
            key = f"l{lane}-{i}"
            try:
                await writer.reserve(tenant, key, "fp", {"tenant:acme": 3}, ttl_ms=HOUR_MS)
            except LedgerUnavailable:
                return
            acknowledged.append(key)
            if len(acknowledged) >= 500:
                enough.set()

    lanes = [asyncio.create_task(reserve_forever(lane)) for lane in range(8)]
    await enough.wait()
    await asyncio.to_thread(redis_server.kill)
    await asyncio.gather(*lanes)
    await writer.aclose()

    await asyncio.to_thread(redis_server.ensure_running)
    reader = Ledger.from_url(redis_server.url)
    try:
        for key in acknowledged:
            hold = await reader.hold(tenant, key)
            assert hold is not None and hold.state is HoldState.PENDING, key
        balance = await reader.balance(tenant, "tenant:acme")
        assert balance is not None
        # Reserves in flight at the kill may or may not have been applied, but
        # each one entirely or not at all.
        assert balance.pending >= 3 * len(acknowledged)
        assert balance.pending <= 3 * (len(acknowledged) + len(lanes))
        assert (await audit_tenant(reader, tenant)).mismatches == []
    finally:
        await reader.aclose()
