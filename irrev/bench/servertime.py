"""Redis server time per ledger script, from INFO commandstats: what each operation
costs the Redis process itself (the scarce resource: one core per primary), beside
a trivial one-write script measured the same way.

Each operation runs alone on the node that serves the tenant's slot, between a
CONFIG RESETSTAT and an INFO commandstats of that node, so FCALL's (Redis 7: the
ledger's Functions library) or EVALSHA's (6.2) `usec/calls` is that operation's
execution time (the commands it calls included), whatever the client and the
network add. The trivial script is run both ways where the server has Functions.

Beside them, reserve's and post's floors (reserve_floor.lua, post_floor.lua): the
Redis commands an admitting reserve and a post run, with their arguments, and none of
their logic. On a tenant of their own (they write made-up balances) in the same node,
with the same accounts. And the same floors in a packed layout (packed_*_floor.lua:
the record one string, each account one field), on a third tenant: what a reserve
and a post could cost if the ledger kept its records so.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib.resources import files
from typing import Any

from redis.asyncio.cluster import RedisCluster

from ledger import AccountSpec, Ledger, ReserveRequest
from ledger.keys import (
    TENANTS_KEY,
    accounts_key,
    hold_keys,
    hold_script_keys,
    reserve_keys,
    tenant_keys,
)

TRIVIAL = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"
TRIVIAL_LIBRARY = (
    "#!lua name=irrev_bench\n"
    "redis.register_function('irrev_bench_trivial', function(keys, argv)\n"
    "  return redis.call('HINCRBY', keys[1], 'n', 1)\n"
    "end)\n"
)
RESERVE_FLOOR = files("irrev.bench").joinpath("reserve_floor.lua").read_text(encoding="utf-8")
POST_FLOOR = files("irrev.bench").joinpath("post_floor.lua").read_text(encoding="utf-8")
PACKED_RESERVE_FLOOR = (
    files("irrev.bench").joinpath("packed_reserve_floor.lua").read_text(encoding="utf-8")
)
PACKED_POST_FLOOR = (
    files("irrev.bench").joinpath("packed_post_floor.lua").read_text(encoding="utf-8")
)
FLOORS = (RESERVE_FLOOR, POST_FLOOR, PACKED_RESERVE_FLOOR, PACKED_POST_FLOOR)
HOUR_MS = 3_600_000
PRICE = 1_000
CONCURRENCY = 16


@dataclass(frozen=True)
class ScriptTime:
    operation: str
    calls: int
    usec_per_call: float
    # The Redis process's CPU (user + system) per call: the script plus reading the
    # command, replying and the event loop, the cost the first figures used.
    cpu_usec_per_call: float


async def script_times(
    ledger: Ledger, tenant: str, accounts: tuple[str, ...], calls: int, batch: int
) -> list[ScriptTime]:
    """Server time of the trivial script, reserve, post, void and approve, `calls`
    of each (the accounts must exist with room for 2 * calls * PRICE)."""
    node = _Node(ledger, tenant)
    run = _Calls(ledger, tenant, accounts, calls, batch)
    sha = await ledger.redis.script_load(TRIVIAL)
    floors = await _Floors.open(run)
    await run.reserve(tenant, "void")
    await run.reserve(tenant, "approve", escalate_above=1)
    functions = await ledger.uses_functions()
    if functions:
        await ledger.redis.function_load(TRIVIAL_LIBRARY, replace=True)
    measured = [
        ("trivial", run.trivial("EVALSHA", sha)),
        *([("trivial FCALL", run.trivial("FCALL", "irrev_bench_trivial"))] if functions else []),
        ("reserve", lambda: run.reserve(tenant, "post")),
        ("reserve's floor", run.pipelined(floors.reserve, run.ids("floor"))),
        ("post", run.post),
        ("post's floor", run.pipelined(floors.post, run.ids("postfloor"))),
        ("reserve's floor, packed", run.pipelined(floors.packed_reserve, run.ids("packed"))),
        ("post's floor, packed", run.pipelined(floors.packed_post, run.ids("packed"))),
        ("void", lambda: run.each(lambda k: ledger.void(tenant, k), "void")),
        (
            "approve",
            lambda: run.each(
                lambda k: ledger.approve(tenant, k, "bench", ttl_ms=HOUR_MS), "approve"
            ),
        ),
    ]
    try:
        return [await node.evalsha_time(name, op) for name, op in measured]
    finally:
        await floors.forget()


@dataclass(frozen=True)
class _Calls:
    """The ways script_times calls Redis for one operation: `calls` times, `batch` to
    a pipeline or a ledger batch (or CONCURRENCY at once, one by one), each on a hold
    id of its own."""

    ledger: Ledger
    tenant: str
    accounts: tuple[str, ...]
    calls: int
    batch: int
    # Fresh hold ids on every run: a second run on ids of the first would time replays.
    run: str = field(default_factory=lambda: f"st{uuid.uuid4().hex[:8]}")

    @cached_property
    def amounts(self) -> dict[str, int]:
        return dict.fromkeys(self.accounts, PRICE)

    def ids(self, kind: str) -> list[str]:
        return [f"{self.run}-{kind}-{i}" for i in range(self.calls)]

    def pipelined(
        self, call_of: Callable[[str], tuple[Any, ...]], keys: list[str]
    ) -> Callable[[], Awaitable[None]]:
        """The call of each of `keys`, `batch` to a pipeline."""

        async def run() -> None:
            for start in range(0, len(keys), self.batch):
                async with self.ledger.redis.pipeline(transaction=False) as pipe:
                    for key in keys[start : start + self.batch]:
                        pipe.execute_command(*call_of(key))
                    await pipe.execute()

        return run

    def trivial(self, *command: str) -> Callable[[], Awaitable[None]]:
        counter = f"irrev:{{{self.tenant}}}:bench"
        return self.pipelined(lambda _: (*command, 1, counter), self.ids("trivial"))

    async def reserve(self, tenant: str, kind: str, escalate_above: int = 0) -> None:
        keys = self.ids(kind)
        for start in range(0, self.calls, self.batch):
            requests = [
                ReserveRequest(
                    idempotency_key=k,
                    fingerprint="fp",
                    amounts=self.amounts,
                    ttl_ms=HOUR_MS,
                    escalate_above=escalate_above,
                )
                for k in keys[start : start + self.batch]
            ]
            await self.ledger.reserve_many(tenant, requests)

    async def post(self) -> None:
        keys = self.ids("post")
        for start in range(0, self.calls, self.batch):
            posts = [(k, PRICE // 2) for k in keys[start : start + self.batch]]
            await self.ledger.post_many(self.tenant, posts)

    async def each(self, call: Callable[[str], Awaitable[Any]], kind: str) -> None:
        queue = self.ids(kind)

        async def worker() -> None:
            while queue:
                await call(queue.pop())

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


@dataclass(frozen=True)
class _Floors:
    """The floor scripts, loaded as `shas` (FLOORS' order), and their made-up tenants
    on the measured tenant's node: `tenant` in the ledger's layout, whose `postfloor`
    holds are reserved for the post floor to post, `packed` in the packed one."""

    calls: _Calls
    tenant: str
    packed: str
    shas: tuple[str, ...]

    @classmethod
    async def open(cls, calls: _Calls) -> _Floors:
        ledger = calls.ledger
        tenant = tenant_beside(ledger, calls.tenant)
        for account in calls.accounts:
            await ledger.upsert_account(
                tenant, AccountSpec(account=account, limit=2**52, soft_limit=2**52)
            )
        packed = tenant_beside(ledger, calls.tenant, "packed")
        await open_packed(ledger, packed, calls.accounts)
        shas = tuple([await ledger.redis.script_load(s) for s in FLOORS])
        await calls.reserve(tenant, "postfloor")
        return cls(calls, tenant, packed, shas)

    def reserve(self, key: str) -> tuple[Any, ...]:
        return self._reserve(self.shas[0], self.tenant, key)

    def post(self, key: str) -> tuple[Any, ...]:
        return self._post(self.shas[1], self.tenant, key)

    def packed_reserve(self, key: str) -> tuple[Any, ...]:
        return self._reserve(self.shas[2], self.packed, key)

    def packed_post(self, key: str) -> tuple[Any, ...]:
        return self._post(self.shas[3], self.packed, key)

    def _reserve(self, sha: str, tenant: str, key: str) -> tuple[Any, ...]:
        request = ReserveRequest(
            idempotency_key=key, fingerprint="fp", amounts=self.calls.amounts, ttl_ms=HOUR_MS
        )
        args = self.calls.ledger.reserve_args(request, batched=True)
        return floor_call(sha, reserve_keys(tenant, key), args)

    def _post(self, sha: str, tenant: str, key: str) -> tuple[Any, ...]:
        args = self.calls.ledger.post_args(key, PRICE // 2)
        return floor_call(sha, hold_script_keys(tenant, key), args)

    async def forget(self) -> None:
        ids = self.calls.ids
        await forget(self.calls.ledger, self.tenant, [*ids("floor"), *ids("postfloor")])
        await forget(self.calls.ledger, self.packed, ids("packed"))


def medians(runs: list[list[ScriptTime]]) -> list[ScriptTime]:
    """Each operation's median over `runs` of script_times (the same operations in
    the same order in each): its script time and its CPU, each the median of its own,
    and its calls summed."""
    return [
        ScriptTime(
            same[0].operation,
            sum(t.calls for t in same),
            statistics.median(t.usec_per_call for t in same),
            statistics.median(t.cpu_usec_per_call for t in same),
        )
        for same in zip(*runs, strict=True)
    ]


async def forget(ledger: Ledger, tenant: str, hold_ids: list[str]) -> None:
    """Delete what the floors wrote, their tenant's keys and holds, and its name from
    the ledger's tenants: its made-up balances would fail `irrev ledger audit`."""
    keys = [*tenant_keys(tenant), *(key for h in hold_ids for key in hold_keys(tenant, h))]
    for start in range(0, len(keys), 500):
        await ledger.redis.delete(*keys[start : start + 500])
    await ledger.redis.srem(TENANTS_KEY, tenant)


def floor_call(sha: str, keys: list[str], args: list[str]) -> tuple[Any, ...]:
    """The EVALSHA of a floor script (loaded as `sha`) with the keys and the arguments
    the ledger gives the script it stands for (reserve_keys and Ledger.reserve_args,
    hold_script_keys and Ledger.post_args)."""
    return ("EVALSHA", sha, len(keys), *keys, *args)


async def open_packed(ledger: Ledger, tenant: str, accounts: tuple[str, ...]) -> None:
    """The accounts of the packed floors' made-up tenant, in their layout
    (packed_reserve_floor.lua): limits of 2^52, nothing held or posted."""
    packed = f"{2**52},{2**52},0,0,0,0,0,0"
    await ledger.redis.hset(accounts_key(tenant), mapping=dict.fromkeys(accounts, packed))


def tenant_beside(ledger: Ledger, tenant: str, kind: str = "floor") -> str:
    """A tenant of its own whose keys are on the node of `tenant`'s (on a cluster,
    another slot of the same primary), named `<tenant>-<kind><i>`."""
    want = tenant_node(ledger, tenant).get("target_nodes")
    for i in range(1000):
        candidate = f"{tenant}-{kind}{i}"
        if want is None or tenant_node(ledger, candidate)["target_nodes"] == want:
            return candidate
    raise RuntimeError(f"no tenant name found on the node of {tenant}")


def tenant_node(ledger: Ledger, tenant: str) -> dict[str, Any]:
    """The keyword arguments that send a command to the node of the tenant's slot
    (none on a standalone Redis)."""
    if isinstance(ledger.redis, RedisCluster):
        return {"target_nodes": ledger.redis.get_node_from_key(accounts_key(tenant))}
    return {}


class _Node:
    """CONFIG RESETSTAT and INFO commandstats on the node of the tenant's slot."""

    def __init__(self, ledger: Ledger, tenant: str) -> None:
        self.redis = ledger.redis
        self.target = tenant_node(ledger, tenant)

    async def evalsha_time(self, name: str, operation: Callable[[], Awaitable[None]]) -> ScriptTime:
        """The time of the EVALSHA and FCALL calls `operation` makes."""
        await self.redis.execute_command("CONFIG", "RESETSTAT", **self.target)
        cpu_before = await self._cpu_usec()
        await operation()
        cpu = await self._cpu_usec() - cpu_before
        stats = await self.redis.info("commandstats", **self.target)
        ran = [stats.get(f"cmdstat_{c}", {"calls": 0, "usec": 0}) for c in ("evalsha", "fcall")]
        calls = sum(int(r["calls"]) for r in ran)
        if not calls:
            return ScriptTime(name, 0, 0.0, 0.0)
        return ScriptTime(name, calls, sum(int(r["usec"]) for r in ran) / calls, cpu / calls)

    async def _cpu_usec(self) -> float:
        return await node_cpu_usec(self.redis, self.target)


async def node_cpu_usec(redis: Any, target: dict[str, Any]) -> float:
    """The Redis process's CPU (user + system) so far, in microseconds, of the node
    `target` names (`tenant_node`)."""
    cpu = await redis.info("cpu", **target)
    return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6
