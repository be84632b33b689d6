"""`irrev bench ledger` prints reserve's floor: the Redis commands an admitting
reserve runs, with none of its logic (irrev/bench/reserve_floor.lua). It is a floor
only while it runs what reserve.lua runs: the same commands in the same order, each
with as many arguments, called with as many arguments itself (MONITOR on a real
Redis, for the bench's reserve and for one that keeps a request and a provenance)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from irrev.bench.ledger import ACCOUNTS, BENCH_REQUEST
from irrev.bench.servertime import HOUR_MS, PRICE, RESERVE_FLOOR, floor_call
from ledger import AccountSpec, Ledger, Provenance, ReserveRequest

SENTINEL = "irrev-floor-test-done"


async def commands_of(url: str, run: Callable[[], Awaitable[Any]]) -> list[tuple[str, int]]:
    """(command, number of arguments) of each command Redis ran while `run` ran:
    the script call itself, then each command it made."""
    watcher = aioredis.Redis.from_url(url)
    seen: list[tuple[str, int]] = []
    try:
        async with watcher.monitor() as monitor:

            async def collect() -> None:
                while True:
                    response = await monitor.connection.read_response()
                    line = response.decode() if isinstance(response, bytes) else response
                    words = monitor.command_re.findall(line.split("] ", 1)[1])
                    if words == ["ECHO", SENTINEL]:
                        return
                    seen.append((words[0].upper(), len(words) - 1))

            collecting = asyncio.create_task(collect())
            await run()
            async with aioredis.Redis.from_url(url) as other:
                await other.echo(SENTINEL)
            await asyncio.wait_for(collecting, 10)
    finally:
        await watcher.aclose()
    return [(name, count) for name, count in seen if name not in ("ECHO",)]


@pytest.mark.parametrize("kept", [False, True], ids=["bench", "request+provenance"])
async def test_the_floor_runs_the_commands_of_an_admitting_reserve(
    redis_url: str, tenant: str, kept: bool
) -> None:
    ledger = Ledger.from_url(redis_url)
    floor_tenant = f"{tenant}-floor"
    try:
        for owner in (tenant, floor_tenant):
            for account in ACCOUNTS:
                await ledger.upsert_account(owner, AccountSpec(account, 2**52, 2**52))
        await ledger.load_scripts()
        sha = await ledger.redis.script_load(RESERVE_FLOOR)
        extra: dict[str, Any] = {}
        if kept:
            extra = {"request": BENCH_REQUEST, "provenance": Provenance("r", "a1", "ops", 1000)}
        request = ReserveRequest("h1", "fp", dict.fromkeys(ACCOUNTS, PRICE), HOUR_MS, **extra)

        async def reserve() -> None:
            (result,) = await ledger.reserve_many(tenant, [request])
            assert not isinstance(result, Exception) and result.decision.value == "admit"

        async def floor() -> None:
            assert await ledger.redis.execute_command(
                *floor_call(ledger, sha, floor_tenant, request)
            ) == ["ok"]

        reserved = await commands_of(redis_url, reserve)
        floored = await commands_of(redis_url, floor)
    finally:
        await ledger.aclose()
    assert reserved[0][0] in ("FCALL", "EVALSHA") and floored[0][0] == "EVALSHA"
    assert floored[0][1] == reserved[0][1]
    assert floored[1:] == reserved[1:]
    assert ("SET" if kept else "DEL") in [name for name, _ in reserved]
