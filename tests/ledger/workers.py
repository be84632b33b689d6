"""Worker processes for the ledger's concurrency and crash tests.

Run as `python -m tests.ledger.workers [--replicas N] [--group-ms MS] COMMAND URL TENANT ...` from
the repository root. Every worker announces itself on `<barrier>:ready` and waits for a token on
`<barrier>:go`, so the test releases all of them at once without sleeping.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio.cluster import RedisCluster

from ledger.archive import archive_settled
from ledger.checkpoint import CheckpointMoved, trim
from ledger.client import Ledger
from ledger.errors import HoldStateConflict, LedgerError, PoolShrank, RateLimited
from ledger.keys import accounts_key
from ledger.records import OpenPool, PoolTicket, ReserveRequest, ReserveResult, pool_tag

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
    so the test can SIGKILL this process mid-storm, and at the end how many reserves
    fewer replicas than asked for acknowledged."""
    await barrier(ledger, barrier_name)
    unreplicated = 0
    for i in range(int(ops)):
        key = f"{agent}-{i}"
        amounts = {"tenant:acme": 7 + i % 5, f"agent:{agent}": 7 + i % 5}
        result = await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
        unreplicated += (result.replicas or 0) < ledger.replicas
        if result.decision == "admit":
            step = i % 4
            if step == 0:
                await ledger.post(tenant, key, 3 + i % 9)
            elif step == 1:
                await ledger.void(tenant, key)
            elif step == 2:
                await ledger.mark_ambiguous(tenant, key, "test")
        print(i, flush=True)
    print(json.dumps({"unreplicated": unreplicated}))


async def replay(
    ledger: Ledger, tenant: str, barrier_name: str, prefix: str, count: str, rounds: str
) -> None:
    """Send the reserves of holds `<prefix>-0..count-1` (admitted before) again,
    `rounds` times: each must come back as a replay, never as a new admission."""
    await barrier(ledger, barrier_name)
    fresh = 0
    for _ in range(int(rounds)):
        for i in range(int(count)):
            amounts = {"tenant:acme": 5, f"agent:{prefix}": 5}
            result = await ledger.reserve(tenant, f"{prefix}-{i}", "fp", amounts, ttl_ms=HOUR_MS)
            fresh += not result.replayed
        print(fresh, flush=True)
    print(json.dumps({"fresh": fresh}))


async def batches(ledger: Ledger, tenant: str, barrier_name: str, agent: str, ops: str) -> None:
    """Reserve and post `ops` holds 20 at a time through the pipelined batch calls,
    reporting each batch on stdout and the items that came back as errors at the end."""
    await barrier(ledger, barrier_name)
    failed = 0
    for start in range(0, int(ops), 20):
        keys = [f"{agent}-{i}" for i in range(start, min(start + 20, int(ops)))]
        amounts = {"tenant:acme": 3, f"agent:{agent}": 3}
        requests = [
            ReserveRequest(idempotency_key=k, fingerprint="fp", amounts=amounts, ttl_ms=HOUR_MS)
            for k in keys
        ]
        failed += sum(
            isinstance(r, LedgerError) for r in await ledger.reserve_many(tenant, requests)
        )
        posts = await ledger.post_many(tenant, [(k, 2) for k in keys])
        failed += sum(isinstance(r, LedgerError) for r in posts)
        print(start, flush=True)
    print(json.dumps({"failed": failed}))


async def grouped(ledger: Ledger, tenant: str, barrier_name: str, agent: str, ops: str) -> None:
    """Reserve and post `ops` holds, 16 at a time from concurrent tasks (so that a
    ledger with group commit groups them), reporting each pair on stdout."""
    await barrier(ledger, barrier_name)
    queue = list(range(int(ops)))

    async def run() -> None:
        while queue:
            i = queue.pop(0)
            key = f"{agent}-{i}"
            amounts = {"tenant:acme": 4, f"agent:{agent}": 4}
            await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
            await ledger.post(tenant, key, 3)
            print(i, flush=True)

    await asyncio.gather(*(run() for _ in range(16)))
    print(json.dumps({"done": int(ops)}))


async def writes(ledger: Ledger, tenant: str, barrier_name: str, agent: str, stop: str) -> None:
    """Reserve and post new holds one after another until the key `stop` exists,
    timing the gap between consecutive completed pairs (a slot migration shows as
    the longest); a pair that fails is counted and the next one tried."""
    await barrier(ledger, barrier_name)
    done = failed = 0
    longest = 0.0
    last = time.monotonic()
    while done % 20 or not await ledger.redis.exists(stop):
        key = f"{agent}-{done + failed}"
        amounts = {"tenant:acme": 2, f"agent:{agent}": 2}
        try:
            await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
            await ledger.post(tenant, key, 1)
        except LedgerError:
            failed += 1
            continue
        done += 1
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        if done % 100 == 0:
            print(done, flush=True)
    print(json.dumps({"writes": done, "failed": failed, "longest_gap_ms": round(longest * 1000)}))


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


async def pooled(
    ledger: Ledger, tenant: str, barrier_name: str, agent: str, ops: str, route: str
) -> None:
    """Reserve holds of one calibrating route and close them every way (post, void,
    ambiguous then post, expire), each priced for the open set its last reply showed:
    a set that shrank meanwhile sends the reserve back (PoolShrank) and it is priced
    again for the set as it is. Reports each operation on stdout, and at the end the
    smallest count a kept hold's reply showed (never below 1: the hold itself) and
    how many reserves were sent back."""
    await barrier(ledger, barrier_name)
    tag, seen, least, sent_back = pool_tag(route), OpenPool(), 1 << 30, 0
    for i in range(int(ops)):
        key, face = f"{agent}-{i}", 100 + 37 * (i % 7)
        step = i % 5
        ttl = 1 if step == 3 else HOUR_MS
        result: ReserveResult | None = None
        for attempt in range(4):
            pending = seen.effective(face) if attempt < 3 else 1.0
            try:
                result = await ledger.reserve(
                    tenant,
                    key,
                    "fp",
                    {"tenant:acme": 5},
                    ttl_ms=ttl,
                    armed=step != 3,
                    pool=PoolTicket(tag, face, pending, 5),
                )
                break
            except PoolShrank as shrank:
                sent_back += 1
                seen = shrank.pool
        assert result is not None and result.pool is not None
        seen = result.pool
        least = min(least, seen.count)
        if step == 0:
            await ledger.post(tenant, key, 3)
        elif step == 1:
            await ledger.void(tenant, key)
        elif step == 2:
            await ledger.mark_ambiguous(tenant, key, "test")
            await ledger.post(tenant, key, 4)
        elif step == 3:
            await ledger.sweep(tenant)
        print(i, flush=True)
    print(json.dumps({"least": least, "sent_back": sent_back}))


async def stale_batch(ledger: Ledger, tenant: str, url: str, primary_pid: str) -> None:
    """reserve_many sent on a stale slot map (the slot pointed at another primary, so
    it is answered MOVED) whose re-send to the slot's primary times out: this worker
    SIGSTOPs that primary for the call, less than the cluster's node timeout. Prints
    each item's result type. Its own client times out after 0.3 s (and keeps the
    `ledger`'s waits); a client that gives up on a stopped node leaves connections
    for the garbage collector, so this runs in a process of its own."""
    stale = Ledger.from_url(url, replicas=ledger.replicas, socket_timeout=0.3)
    try:
        key = accounts_key(tenant)
        warm = [
            ReserveRequest(
                idempotency_key="w0", fingerprint="fp", amounts={"tenant:acme": 1}, ttl_ms=HOUR_MS
            )
        ]
        assert isinstance((await stale.reserve_many(tenant, warm))[0], ReserveResult)
        cluster = stale.redis
        assert isinstance(cluster, RedisCluster)
        right = cluster.get_node_from_key(key)
        assert right is not None
        wrong = next(node for node in cluster.get_primaries() if node.name != right.name)
        cluster.nodes_manager.slots_cache[cluster.keyslot(key)] = [wrong]
        orders = [
            ReserveRequest(
                idempotency_key=k, fingerprint="fp", amounts={"tenant:acme": 100}, ttl_ms=HOUR_MS
            )
            for k in ("t1", "t2")
        ]
        os.kill(int(primary_pid), signal.SIGSTOP)
        try:
            results = await stale.reserve_many(tenant, orders)
        finally:
            os.kill(int(primary_pid), signal.SIGCONT)
        print(json.dumps([type(result).__name__ for result in results]))
    finally:
        await stale.aclose()


async def keyless(ledger: Ledger, tenant: str, barrier_name: str, content: str, price: str) -> None:
    """One call without a key of its own: which hold its content is, then its reserve
    (a repeat replays it). Prints the hold id and whether the reserve was a replay."""
    await barrier(ledger, barrier_name)
    attached = await ledger.attach(
        tenant, content, lambda g: f"{content}-{g}", window_ms=600_000, keep_ms=HOUR_MS
    )
    amounts = {"tenant:acme": int(price)}
    result = await ledger.reserve(tenant, attached.hold_id, "fp", amounts, ttl_ms=HOUR_MS)
    print(json.dumps({"hold": attached.hold_id, "replayed": result.replayed}))


async def escalate(ledger: Ledger, tenant: str, barrier_name: str, agent: str, count: str) -> None:
    """`count` reserves that would each escalate (above the threshold), all at once."""
    await barrier(ledger, barrier_name)

    async def one(i: int) -> str:
        amounts = {f"agent:{agent}": 10}
        result = await ledger.reserve(
            tenant,
            f"{barrier_name}-{os.getpid()}-{i}",
            "fp",
            amounts,
            ttl_ms=HOUR_MS,
            escalate_above=1,
        )
        return result.state.value

    states = await asyncio.gather(*(one(i) for i in range(int(count))))
    print(json.dumps({"states": states}))


async def paced(ledger: Ledger, tenant: str, barrier_name: str, count: str) -> None:
    """`count` reserves at once on agent:a1, whose effect rate may refuse them."""
    await barrier(ledger, barrier_name)

    async def one(i: int) -> str:
        amounts = {"tenant:acme": 1, "agent:a1": 1}
        try:
            result = await ledger.reserve(
                tenant, f"{barrier_name}-{os.getpid()}-{i}", "fp", amounts, ttl_ms=HOUR_MS
            )
        except RateLimited:
            return "rate_limited"
        return result.state.value

    print(json.dumps({"outcomes": await asyncio.gather(*(one(i) for i in range(int(count))))}))


async def archiver(
    ledger: Ledger, tenant: str, barrier_name: str, stop: str, keep_ms: str = "5000"
) -> None:
    """archive_settled (after 0 ms, small batches, restored holds kept `keep_ms`) again
    and again until the key `stop` exists: several race one another, the test may
    SIGKILL one."""
    await barrier(ledger, barrier_name)
    passes = archived = 0
    while not await ledger.redis.exists(stop):
        done = await archive_settled(
            ledger, tenant, after_ms=0, batch=7, keep_restored_ms=int(keep_ms)
        )
        passes, archived = passes + 1, archived + done.archived
    print(json.dumps({"passes": passes, "archived": archived}))


async def meddle(
    ledger: Ledger, tenant: str, barrier_name: str, prefix: str, count: str, stop: str
) -> None:
    """Over holds `<prefix>-0..count-1` (posted at 10**6) until the key `stop` exists:
    replay each reserve (must be a replay), compensate 1 and read it back; prints
    what it did and every error it met."""
    await barrier(ledger, barrier_name)
    fresh = compensated = 0
    errors: list[str] = []
    while not await ledger.redis.exists(stop):
        for i in range(int(count)):
            hold_id = f"{prefix}-{i}"
            try:
                amounts = {"tenant:acme": 10, "agent:a": 10}
                result = await ledger.reserve(tenant, hold_id, "fp", amounts, ttl_ms=HOUR_MS)
                fresh += not result.replayed
                done = await ledger.compensate(tenant, hold_id, 1)
                compensated += done.status.value == "ok"
                if await ledger.hold(tenant, hold_id) is None:
                    errors.append(f"{hold_id}: read as None")
            except LedgerError as exc:
                errors.append(f"{hold_id}: {type(exc).__name__}: {exc}")
    print(json.dumps({"fresh": fresh, "compensated": compensated, "errors": errors[:20]}))


async def flip(ledger: Ledger, tenant: str, barrier_name: str, hold_id: str, stop: str) -> None:
    """Bring hold `hold_id` back into the slot (a replay of its reserve) and archive it
    again, until the key `stop` exists."""
    await barrier(ledger, barrier_name)
    flips = 0
    while not await ledger.redis.exists(stop):
        amounts = {"tenant:acme": 10, "agent:a": 10}
        await ledger.reserve(tenant, hold_id, "fp", amounts, ttl_ms=HOUR_MS)
        done = await archive_settled(ledger, tenant, after_ms=0, keep_restored_ms=0)
        flips += done.archived
    print(json.dumps({"flips": flips}))


# Each worker takes the ledger, the tenant and then its own arguments, as argv's strings.
COMMANDS: dict[str, Callable[..., Awaitable[None]]] = {
    "archiver": archiver,
    "meddle": meddle,
    "flip": flip,
    "escalate": escalate,
    "paced": paced,
    "keyless": keyless,
    "stale_batch": stale_batch,
    "storm": storm,
    "approve": approve,
    "churn": churn,
    "replay": replay,
    "batches": batches,
    "grouped": grouped,
    "writes": writes,
    "trim": trim_all,
    "pooled": pooled,
}


async def main(argv: list[str]) -> None:
    replicas, group_ms = 0, 0.0
    if argv[0] == "--replicas":  # WAIT for that many replicas after each reserve
        replicas, argv = int(argv[1]), argv[2:]
    if argv[0] == "--group-ms":  # group commit (ledger/group.py)
        group_ms, argv = float(argv[1]), argv[2:]
    command, url, tenant, *rest = argv
    ledger = Ledger.from_url(
        url, replicas=replicas, replica_timeout_ms=5000, group_wait_ms=group_ms
    )
    try:
        await COMMANDS[command](ledger, tenant, *rest)
    finally:
        await ledger.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
