"""`irrev bench ledger` prints reserve's and post's floors: the Redis commands an
admitting reserve and a post run, with none of their logic (irrev/bench/*_floor.lua).
Each is a floor only while it runs what its script runs: the same commands in the
same order, each with as many arguments, called with as many arguments itself
(MONITOR on a real Redis; for reserve, the bench's and one that keeps a request and a
provenance; for post, the bench's)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from irrev.bench.ledger import ACCOUNTS, BENCH_REQUEST
from irrev.bench.servertime import HOUR_MS, POST_FLOOR, PRICE, RESERVE_FLOOR, floor_call
from ledger import AccountSpec, Ledger, Provenance, ReserveRequest
from ledger.keys import hold_key


async def commands_of(
    url: str, run: Callable[[], Awaitable[Any]], key: str
) -> list[tuple[str, int]]:
    """(command, number of arguments) of the script call on `key` that `run` made,
    then of each command that script made. Other clients of the test Redis (the
    session's gateways sweep it) show in MONITOR too: a script's own commands are the
    `lua` lines right after its call, as a script runs alone."""
    watcher = aioredis.Redis.from_url(url)
    sentinel = f"irrev-floor-test-{uuid.uuid4().hex}"
    lines: list[tuple[bool, list[str]]] = []
    try:
        async with watcher.monitor() as monitor:

            async def collect() -> None:
                while True:
                    response = await monitor.connection.read_response()
                    line = response.decode() if isinstance(response, bytes) else response
                    client, command = line.split(" [", 1)[1].split("] ", 1)
                    words = monitor.command_re.findall(command)
                    if words == ["ECHO", sentinel]:
                        return
                    lines.append((client.endswith(" lua"), words))

            collecting = asyncio.create_task(collect())
            await run()
            async with aioredis.Redis.from_url(url) as other:
                await other.echo(sentinel)
            await asyncio.wait_for(collecting, 10)
    finally:
        await watcher.aclose()
    start = next(i for i, (lua, words) in enumerate(lines) if not lua and key in words)
    ran = [lines[start][1]]
    for lua, words in lines[start + 1 :]:
        if not lua:
            break
        ran.append(words)
    return [(words[0].upper(), len(words) - 1) for words in ran]


@pytest.fixture
async def ledger(redis_url: str, tenant: str) -> AsyncIterator[Ledger]:
    """A ledger whose `tenant` and `<tenant>-floor` have the bench's accounts."""
    ledger = Ledger.from_url(redis_url)
    for owner in (tenant, f"{tenant}-floor"):
        for account in ACCOUNTS:
            await ledger.upsert_account(owner, AccountSpec(account, 2**52, 2**52))
    await ledger.load_scripts()
    yield ledger
    await ledger.aclose()


async def same_commands(
    url: str,
    tenant: str,
    script: Callable[[], Awaitable[Any]],
    floor: Callable[[], Awaitable[Any]],
) -> list[tuple[str, int]]:
    """The commands `script` made Redis run on hold h1 of `tenant`, once checked to be
    those `floor` made on h1 of `<tenant>-floor`."""
    ran = await commands_of(url, script, hold_key(tenant, "h1"))
    floored = await commands_of(url, floor, hold_key(f"{tenant}-floor", "h1"))
    assert ran[0][0] in ("FCALL", "EVALSHA") and floored[0][0] == "EVALSHA"
    assert floored[0][1] == ran[0][1]
    assert floored[1:] == ran[1:]
    return ran


@pytest.mark.parametrize("kept", [False, True], ids=["bench", "request+provenance"])
async def test_the_floor_runs_the_commands_of_an_admitting_reserve(
    ledger: Ledger, redis_url: str, tenant: str, kept: bool
) -> None:
    sha = await ledger.redis.script_load(RESERVE_FLOOR)
    extra: dict[str, Any] = {}
    if kept:
        extra = {"request": BENCH_REQUEST, "provenance": Provenance("r", "a1", "ops", 1000)}
    request = ReserveRequest("h1", "fp", dict.fromkeys(ACCOUNTS, PRICE), HOUR_MS, **extra)

    async def reserve() -> None:
        (result,) = await ledger.reserve_many(tenant, [request])
        assert not isinstance(result, Exception) and result.decision.value == "admit"

    async def floor() -> None:
        call = floor_call(sha, f"{tenant}-floor", "h1", ledger.reserve_args(request))
        assert await ledger.redis.execute_command(*call) == ["ok"]

    reserved = await same_commands(redis_url, tenant, reserve, floor)
    assert ("SET" if kept else "DEL") in [name for name, _ in reserved]


async def test_the_floor_runs_the_commands_of_a_post(
    ledger: Ledger, redis_url: str, tenant: str
) -> None:
    for owner in (tenant, f"{tenant}-floor"):
        held = ReserveRequest("h1", "fp", dict.fromkeys(ACCOUNTS, PRICE), HOUR_MS)
        await ledger.reserve_many(owner, [held])
    sha = await ledger.redis.script_load(POST_FLOOR)

    async def post() -> None:
        (result,) = await ledger.post_many(tenant, [("h1", PRICE // 2)])
        assert not isinstance(result, Exception) and result.state.value == "posted"

    async def floor() -> None:
        call = floor_call(sha, f"{tenant}-floor", "h1", ledger.post_args("h1", PRICE // 2))
        assert await ledger.redis.execute_command(*call) == ["ok", "posted", ""]

    await same_commands(redis_url, tenant, post, floor)
