"""Worker processes for the ledger's concurrency and crash tests.

Run as `python -m tests.ledger.workers COMMAND URL TENANT ...` from the repository
root. Every worker announces itself on `<barrier>:ready` and waits for a token on
`<barrier>:go`, so the test releases all of them at once without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from ledger.checkpoint import CheckpointMoved, trim
from ledger.client import Ledger
from ledger.errors import HoldStateConflict

HOUR_MS = 3_600_000


async def barrier(ledger: Ledger, name: str) -> None:
    await ledger.redis.rpush(f"{name}:ready", "1")
    if await ledger.redis.blpop([f"{name}:go"], timeout=60) is None:
        raise SystemExit("barrier: no go signal within 60 s")


async def storm(
    ledger: Ledger,
    tenant: str,
    barrier_name: str,
    agent: str,
    count: str,
    price: str,
    concurrency: str,
) -> None:
    """`count` reserves of `price` on the tenant's and this agent's accounts."""
    await barrier(ledger, barrier_name)
    queue = list(range(int(count)))
    admitted = denied = 0

    async def run() -> None:
        nonlocal admitted, denied
        while queue:
            i = queue.pop()
            amounts = {"tenant:acme": int(price), f"agent:{agent}": int(price)}
            result = await ledger.reserve(tenant, f"{agent}-{i}", "fp", amounts, ttl_ms=HOUR_MS)
            admitted += result.decision == "admit"
            denied += result.decision == "deny"

    await asyncio.gather(*(run() for _ in range(int(concurrency))))
    print(json.dumps({"agent": agent, "admitted": admitted, "denied": denied}))


async def approve(ledger: Ledger, tenant: str, barrier_name: str, hold_id: str, who: str) -> None:
    await barrier(ledger, barrier_name)
    try:
        await ledger.approve(tenant, hold_id, who, ttl_ms=HOUR_MS)
        print(json.dumps({"who": who, "won": True}))
    except HoldStateConflict as exc:
        print(json.dumps({"who": who, "won": False, "state": exc.state, "by": exc.by}))


async def churn(ledger: Ledger, tenant: str, barrier_name: str, agent: str, ops: str) -> None:
    """Reserve and settle in every way, reporting each finished operation on stdout
    so the test can SIGKILL this process mid-storm."""
    await barrier(ledger, barrier_name)
    for i in range(int(ops)):
        key = f"{agent}-{i}"
        amounts = {"tenant:acme": 7 + i % 5, f"agent:{agent}": 7 + i % 5}
        result = await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
        if result.decision == "admit":
            step = i % 4
            if step == 0:
                await ledger.post(tenant, key, 3 + i % 9)
            elif step == 1:
                await ledger.void(tenant, key)
            elif step == 2:
                await ledger.mark_ambiguous(tenant, key, "test")
        print(i, flush=True)


async def trim_all(
    ledger: Ledger, tenant: str, barrier_name: str, archive_dir: str, batch: str
) -> None:
    """Trim the whole journal, `batch` entries a pass, starting over whenever another
    trimmer moved the checkpoint first (no lock: the test races the trimmers)."""
    await barrier(ledger, barrier_name)
    moved = 0
    while True:
        try:
            if await trim(ledger, tenant, Path(archive_dir), 2**52, batch=int(batch)) == 0:
                break
        except CheckpointMoved:
            moved += 1
    print(json.dumps({"moved": moved}))


COMMANDS = {"storm": storm, "approve": approve, "churn": churn, "trim": trim_all}


async def main(argv: list[str]) -> None:
    command, url, tenant, *rest = argv
    ledger = Ledger.from_url(url)
    try:
        await COMMANDS[command](ledger, tenant, *rest)  # type: ignore[operator]
    finally:
        await ledger.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
