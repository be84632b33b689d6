"""A process that spends an escrowed tenant's budget as a gateway would (ledger/escrow.py),
for the escrow cells of the fault matrix and tests/ledger/test_escrow.py, which
SIGKILL it between a transfer's two steps.

`python -m irrev.faults.escrow_worker URL TENANT BARRIER AGENT OPS` announces itself on
`<BARRIER>:ready` and waits for a token on `<BARRIER>:go`, then reserves and posts OPS
holds, 8 at a time, each on the shard of its key, while one more task keeps reclaiming
what the shards hold unused, as a rebalancer would: the shards refill and reclaim from
each other throughout. It prints each admitted hold's key as it is posted, then a JSON
line with the count. A call that finds Redis unreachable is made again (a cell kills
redis-server under it), with the same key.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from ledger import Escrow, Ledger, LedgerUnavailable

HOUR_MS = 3_600_000
TASKS = 8
# What each hold takes of the tenant's account and of the shared agent account, and
# what its post settles.
HELD = {"tenant:acme": 5, "agent:shared": 3}
POSTED = {"tenant:acme": 4, "agent:shared": 2}
RECLAIM = 7
RETRY_S = 0.05

T = TypeVar("T")


async def _again(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, made again while Redis is unreachable."""
    while True:
        try:
            return await call()
        except LedgerUnavailable:
            await asyncio.sleep(RETRY_S)


async def spend(ledger: Ledger, tenant: str, barrier: str, agent: str, ops: int) -> int:
    escrow = await Escrow.of(ledger, tenant)
    await ledger.redis.rpush(f"{barrier}:ready", "1")
    if await ledger.redis.blpop([f"{barrier}:go"], timeout=60) is None:
        raise SystemExit("escrow_worker: no go signal within 60 s")
    queue = list(range(ops))
    admitted = 0

    async def run() -> None:
        nonlocal admitted
        while queue:
            key = f"{agent}-{queue.pop(0)}"
            result = await _again(partial(escrow.reserve, key, "fp", HELD, ttl_ms=HOUR_MS))
            if result.decision == "admit":
                await _again(partial(escrow.post, key, POSTED))
                admitted += 1
                print(key, flush=True)

    async def rebalance() -> None:
        k = 0
        while queue:
            k += 1
            await _again(partial(escrow.reclaim, k % len(escrow.shards), "tenant:acme", RECLAIM))

    await asyncio.gather(rebalance(), *(run() for _ in range(TASKS)))
    return admitted


async def main(argv: list[str]) -> None:
    url, tenant, barrier, agent, ops = argv
    ledger = Ledger.from_url(url)
    try:
        admitted = await spend(ledger, tenant, barrier, agent, int(ops))
    finally:
        await ledger.aclose()
    print(json.dumps({"admitted": admitted}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
