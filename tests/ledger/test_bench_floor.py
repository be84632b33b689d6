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
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from irrev.bench.ledger import ACCOUNTS, BENCH_REQUEST
from irrev.bench.servertime import (
    HOUR_MS,
    PACKED_POST_FLOOR,
    PACKED_RESERVE_FLOOR,
    POST_FLOOR,
    PRICE,
    RESERVE_FLOOR,
    floor_call,
    forget,
    medians,
    open_packed,
    script_times,
    tenant_beside,
)
from ledger import AccountSpec, Ledger, Provenance, ReserveRequest
from ledger.journal import iter_journal
from ledger.keys import accounts_key, hold_key, hold_script_keys, reserve_keys
from ledger.replies import decoded


async def commands_of(url: str, run: Callable[[], Awaitable[Any]], key: str) -> list[list[str]]:
    """The script call on `key` that `run` made, then each command that script made,
    as MONITOR shows them on `url` (on a cluster, the node of `key`). Other clients of the test Redis (the
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
    return ran


@dataclass
class Bench:
    """A ledger whose `tenant` and `floor` (a tenant on the same node, as the bench
    picks it) have the bench's accounts, and the URL of that node."""

    ledger: Ledger
    tenant: str
    floor: str
    url: str


@pytest.fixture
async def bench(redis_url: str, tenant: str) -> AsyncIterator[Bench]:
    ledger = Ledger.from_url(redis_url)
    await ledger.load_scripts()  # and, on a cluster, learns the slots tenant_beside reads
    floor = tenant_beside(ledger, tenant)
    for owner in (tenant, floor):
        for account in ACCOUNTS:
            await ledger.upsert_account(
                owner, AccountSpec(account=account, limit=2**52, soft_limit=2**52)
            )
    url = redis_url
    if isinstance(ledger.redis, RedisCluster):  # MONITOR shows one node's commands
        node = ledger.redis.get_node_from_key(accounts_key(tenant))
        assert node is not None
        url = f"redis://{node.host}:{node.port}"
    yield Bench(ledger, tenant, floor, url)
    await forget(ledger, floor, ["h1"])  # its made-up balances would fail an audit
    await ledger.aclose()


async def same_commands(
    bench: Bench, script: Callable[[], Awaitable[Any]], floor: Callable[[], Awaitable[Any]]
) -> list[str]:
    """The commands `script` made Redis run on hold h1 of the bench's tenant, once
    checked to be those `floor` made on h1 of its floor tenant: the same commands in
    order, each with as many arguments and on the same key (the tenant's name aside),
    called with as many arguments."""
    ran = await commands_of(bench.url, script, hold_key(bench.tenant, "h1"))
    floored = await commands_of(bench.url, floor, hold_key(bench.floor, "h1"))
    assert ran[0][0].upper() in ("FCALL", "EVALSHA") and floored[0][0].upper() == "EVALSHA"
    assert len(floored[0]) == len(ran[0])
    ours, theirs = f"{{{bench.floor}}}", f"{{{bench.tenant}}}"

    def shape(words: list[str]) -> tuple[str, int, str]:
        return words[0].upper(), len(words), words[1].replace(ours, theirs) if words[1:] else ""

    assert [shape(words) for words in floored[1:]] == [shape(words) for words in ran[1:]]
    return [words[0].upper() for words in ran]


@pytest.mark.parametrize("kept", [False, True], ids=["bench", "request+provenance"])
async def test_the_floor_runs_the_commands_of_an_admitting_reserve(
    bench: Bench, kept: bool
) -> None:
    ledger = bench.ledger
    sha = await ledger.redis.script_load(RESERVE_FLOOR)
    extra: dict[str, Any] = {}
    if kept:
        extra = {
            "request": BENCH_REQUEST,
            "provenance": Provenance(route="r", agent="a1", principal="ops", face_value=1000),
        }
    request = ReserveRequest(
        idempotency_key="h1",
        fingerprint="fp",
        amounts=dict.fromkeys(ACCOUNTS, PRICE),
        ttl_ms=HOUR_MS,
        **extra,
    )

    async def reserve() -> None:
        (result,) = await ledger.reserve_many(bench.tenant, [request])
        assert not isinstance(result, Exception) and result.decision.value == "admit"

    async def floor() -> None:
        call = floor_call(
            sha, reserve_keys(bench.floor, "h1"), ledger.reserve_args(request, batched=True)
        )
        assert await ledger.redis.execute_command(*call) == ["ok"]

    assert ("SET" if kept else "DEL") in await same_commands(bench, reserve, floor)


async def test_the_floor_runs_the_commands_of_a_post(bench: Bench) -> None:
    ledger = bench.ledger
    for owner in (bench.tenant, bench.floor):
        held = ReserveRequest(
            idempotency_key="h1",
            fingerprint="fp",
            amounts=dict.fromkeys(ACCOUNTS, PRICE),
            ttl_ms=HOUR_MS,
        )
        await ledger.reserve_many(owner, [held])
    sha = await ledger.redis.script_load(POST_FLOOR)

    async def post() -> None:
        (result,) = await ledger.post_many(bench.tenant, [("h1", PRICE // 2)])
        assert not isinstance(result, Exception) and result.state.value == "posted"

    async def floor() -> None:
        call = floor_call(
            sha, hold_script_keys(bench.floor, "h1"), ledger.post_args("h1", PRICE // 2)
        )
        assert await ledger.redis.execute_command(*call) == ["ok", "posted", ""]

    await same_commands(bench, post, floor)


RECORD = ("st", "fp", "arm", "t0", "dl", "acc", "amt", "why", "lim", "used")
BALANCE = ("limit", "soft", "win", "appr", "pend", "post", "ws", "over")


async def test_the_packed_floors_keep_what_the_records_and_balances_keep(bench: Bench) -> None:
    """The packed layout is cheaper only if it keeps as much: after a reserve and after
    a post, its record holds the values of reserve.lua's and post.lua's, and each
    account the balances the ledger's has."""
    ledger, redis = bench.ledger, bench.ledger.redis
    packed = tenant_beside(ledger, bench.tenant, "packed")
    await open_packed(ledger, packed, ACCOUNTS)
    reserve_sha = await redis.script_load(PACKED_RESERVE_FLOOR)
    post_sha = await redis.script_load(PACKED_POST_FLOOR)
    request = ReserveRequest(
        idempotency_key="h1",
        fingerprint="fp",
        amounts=dict.fromkeys(ACCOUNTS, PRICE),
        ttl_ms=HOUR_MS,
    )

    async def both() -> tuple[dict[str, str], dict[str, str]]:
        """The ledger's record of h1 and the packed one, by field name."""
        ours: dict[str, str] = await decoded(redis.hgetall(hold_key(bench.tenant, "h1")))
        text: str = await decoded(redis.get(hold_key(packed, "h1")))
        names = RECORD if text.startswith("pending") else (*RECORD, "pst", "pws", "tp")
        return ours, dict(zip(names, text.split("|"), strict=True))

    async def balances(tenant: str, packed_layout: bool) -> list[list[str]]:
        key = accounts_key(tenant)
        if packed_layout:
            packed: list[str] = [await decoded(redis.hget(key, a)) for a in ACCOUNTS]
            return [balance.split(",") for balance in packed]
        return [await decoded(redis.hmget(key, [f"{a}|{f}" for f in BALANCE])) for a in ACCOUNTS]

    try:
        await ledger.reserve_many(bench.tenant, [request])
        call = floor_call(
            reserve_sha, reserve_keys(packed, "h1"), ledger.reserve_args(request, batched=True)
        )
        assert await redis.execute_command(*call) == ["ok"]
        ours, theirs = await both()
        assert {k: ours[k] for k in RECORD if k not in ("t0", "dl")} == {
            k: theirs[k] for k in RECORD if k not in ("t0", "dl")
        }
        assert int(theirs["dl"]) - int(theirs["t0"]) == HOUR_MS
        assert await balances(packed, True) == [
            [b or "0" for b in row] for row in await balances(bench.tenant, False)
        ]

        await ledger.post_many(bench.tenant, [("h1", PRICE // 2)])
        call = floor_call(
            post_sha, hold_script_keys(packed, "h1"), ledger.post_args("h1", PRICE // 2)
        )
        assert await redis.execute_command(*call) == ["ok", "posted", ""]
        ours, theirs = await both()
        assert (theirs["st"], theirs["pst"], theirs["pws"]) == (
            ours["st"],
            ours["pst"],
            ours["pws"],
        )
        assert int(theirs["tp"]) >= int(theirs["t0"])
        assert await balances(packed, True) == [
            [b or "0" for b in row] for row in await balances(bench.tenant, False)
        ]
    finally:
        await forget(ledger, packed, ["h1"])


async def test_every_run_of_the_server_times_reserves_and_posts_holds_of_its_own(
    bench: Bench,
) -> None:
    """`--script-runs 2` times two runs on one tenant: the second on hold ids of the
    first would time replays (nothing decided, nothing written), not reserves."""
    runs = [await script_times(bench.ledger, bench.tenant, ACCOUNTS, 3, 2) for _ in range(2)]
    ops = [entry.op async for entry in iter_journal(bench.ledger, bench.tenant)]
    # Each run reserves 3 holds to post, 3 to void and 3 to approve, and settles them.
    assert (ops.count("reserve"), ops.count("post"), ops.count("void")) == (18, 6, 6)
    merged = medians(runs)
    assert [t.operation for t in merged] == [t.operation for t in runs[0]]
    [reserve] = [t for t in merged if t.operation == "reserve"]
    each = [t for run in runs for t in run if t.operation == "reserve"]
    # Summed calls (3 a run, and any script call the session's gateways made on the node
    # meanwhile: INFO commandstats counts the node's), and the median of two: their mean.
    assert reserve.calls == sum(t.calls for t in each) >= 6
    assert reserve.usec_per_call == sum(t.usec_per_call for t in each) / 2
