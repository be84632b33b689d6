"""How the ledger's Lua reaches Redis: a Functions library on Redis 7 (and on every
primary of a cluster), scripts on 6.2, loaded again wherever Redis lost them."""

from __future__ import annotations

import asyncio
from importlib.resources import files

from redis.asyncio.cluster import RedisCluster

from ledger.client import Ledger
from ledger.records import HoldState, ReserveRequest, ReserveResult
from ledger.scripts import OPERATIONS, PLAIN_SCRIPTS, function_library, script_source

from .conftest import open_accounts

HOUR_MS = 3_600_000


def _redis_version(info: dict[str, object]) -> tuple[int, ...]:
    return tuple(int(part) for part in str(info["redis_version"]).split("."))


async def test_functions_on_redis_7_scripts_on_6(ledger: Ledger) -> None:
    info = await ledger.redis.info("server")
    if isinstance(ledger.redis, RedisCluster):
        info = next(iter(info.values())) if "redis_version" not in info else info
    assert await ledger.uses_functions() == (_redis_version(info) >= (7,))
    assert await ledger.scripts_loaded()


async def test_a_lost_library_or_script_is_loaded_again(ledger: Ledger, tenant: str) -> None:
    """A restarted 6.2 forgets its scripts; a new or flushed primary lacks the
    library: the call that finds it missing loads it and runs, single or batched."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    for forget in ("single", "batch"):
        if await ledger.uses_functions():
            await ledger.redis.function_flush()  # on a cluster: every primary
        else:
            await ledger.redis.script_flush()
        assert not await ledger.scripts_loaded()
        if forget == "single":
            held = await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS)
            assert held.state is HoldState.PENDING
        else:
            batch = [
                ReserveRequest(
                    idempotency_key=f"b{i}",
                    fingerprint="fp",
                    amounts={"tenant:acme": 10},
                    ttl_ms=HOUR_MS,
                )
                for i in range(3)
            ]
            replies = await ledger.reserve_many(tenant, batch)
            assert [r.state if isinstance(r, ReserveResult) else r for r in replies] == [
                HoldState.PENDING
            ] * 3
        # Another process on this Redis (a gateway of the session) that met the flush
        # first may be loading the scripts one by one: this call then ran without
        # loading them itself, and the rest arrive as that process finishes.
        deadline = asyncio.get_running_loop().time() + 30
        while not await ledger.scripts_loaded():
            assert asyncio.get_running_loop().time() < deadline, "the scripts never came back"
            await asyncio.sleep(0.05)


def test_the_library_name_carries_its_version() -> None:
    """Two versions of irrev on one Redis (a rolling upgrade) each call their own
    functions: a change of code is a change of names."""
    library = function_library()
    assert library.code.startswith(f"#!lua name={library.name}\n")
    version = library.name.removeprefix("irrev_")
    assert len(version) == 12 and all(
        name == f"irrev_{version}_{op}" for op, name in library.functions.items()
    )
    # The 6.2 scripts carry only the helpers they name.
    assert "local function roll" not in script_source("retry")
    assert "local function roll" in script_source("post")


def test_only_the_library_keeps_caches() -> None:
    """An EVALSHA script's top level runs on every call (Redis 6.2), so its form takes
    _eval.lua's `remembering` (no cache) and `field` (one name, no table of all of
    an account's names); the library (Redis 7) keeps its caches between calls."""
    for operation in ("reserve", "post", "void", "approve"):
        source = script_source(operation)
        assert "local cache, size" not in source, operation
        assert "local names_of" not in source, operation
    assert "local cache, size" in function_library().code
    assert "names_of(id)[name]" in function_library().code


def test_every_script_is_in_the_library_or_plain_on_purpose() -> None:
    """A new .lua file must join the library (whose digest then versions it) or be
    named a plain script: none is left out of both by accident."""
    stems = {
        entry.name.removesuffix(".lua")
        for entry in files("ledger.lua").iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    }
    assert stems == set(OPERATIONS) | set(PLAIN_SCRIPTS)
    assert not set(OPERATIONS) & set(PLAIN_SCRIPTS)
    library = function_library()
    for operation in OPERATIONS:
        body = files("ledger.lua").joinpath(f"{operation}.lua").read_text(encoding="utf-8")
        assert body in library.code, operation  # so the library's version covers it
