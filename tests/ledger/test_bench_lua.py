"""`irrev bench lua` times reserve and post in a loop inside one FCALL, this
checkout's scripts beside a baseline's. It must time the real operations (each an
admission, each a post), refuse what it cannot measure with a message that says
what to use instead, and never report a baseline that answered otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster

from irrev.bench.lua import HERE, measure
from irrev.cli import CliError
from ledger import Ledger
from ledger.keys import TENANTS_KEY
from ledger.replies import decoded


async def server_kind(redis_url: str) -> str:
    ledger = Ledger.from_url(redis_url)
    try:
        if isinstance(ledger.redis, RedisCluster):
            return "cluster"
        return "functions" if await ledger.uses_functions() else "scripts"
    finally:
        await ledger.aclose()


async def test_it_times_both_checkouts_or_says_why_not(redis_url: str, tmp_path: Path) -> None:
    baseline = tmp_path / "lua"
    shutil.copytree(HERE, baseline)
    kind = await server_kind(redis_url)
    if kind != "functions":
        with pytest.raises(CliError) as refused:
            await measure(redis_url, [HERE, baseline], loops=3, runs=1)
        want = "Redis Cluster" if kind == "cluster" else "needs Redis 7+ Functions"
        assert want in str(refused.value)
        return
    costs = await measure(redis_url, [HERE, baseline], loops=5, runs=2)
    assert [c.scripts for c in costs] == [str(HERE), str(baseline)]
    assert all(c.reserve_us > 0 and c.post_us > 0 for c in costs)
    # Its tenants and holds are gone: nothing of the bench's is left in the server.
    ledger = Ledger.from_url(redis_url)
    try:
        tenants: set[str] = await decoded(ledger.redis.smembers(TENANTS_KEY))
        left = [key async for key in ledger.redis.scan_iter(match="irrev:{benchlua-*")]
    finally:
        await ledger.aclose()
    assert [t for t in tenants if t.startswith("benchlua-")] == [] and left == []


async def test_a_baseline_that_does_not_admit_is_reported_not_timed(
    redis_url: str, tmp_path: Path
) -> None:
    if await server_kind(redis_url) != "functions":
        pytest.skip("the loop is a Functions library (Redis 7+, standalone)")
    baseline = tmp_path / "lua"
    shutil.copytree(HERE, baseline)
    reserve = baseline / "reserve.lua"
    # A reserve that takes other arguments answers bad_input, in no time at all.
    reserve.write_text(
        "do return {'bad_input', 'accounts', 'other arguments'} end\n" + reserve.read_text()
    )
    with pytest.raises(CliError) as refused:
        await measure(redis_url, [HERE, baseline], loops=3, runs=1)
    assert str(baseline) in str(refused.value) and "bad_input" in str(refused.value)
    # Its libraries are not left behind in the server it was pointed at.
    ledger = Ledger.from_url(redis_url)
    try:
        listed = await ledger.redis.function_list(library="irrevloop_*")
    finally:
        await ledger.aclose()
    assert listed == []
