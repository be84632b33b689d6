"""`irrev bench escrow` (issue 27 item 5): one tenant's reserve+post with all its keys
in one slot, against the same tenant split over escrow shards on every primary
(ledger/escrow.py), in turn, on a local Redis Cluster (Redis 7, 3 primaries, no
replicas) unless --url names one.

Each round runs --clients clients in each of --processes processes (one event loop
each, the way gateway workers are) for --seconds, and reads every primary's CPU (INFO
cpu) before and after. It prints admissions/s; each primary's share of the Redis CPU
the round used (the spread: the busiest primary's share over an even one); and the
tenant's ceiling, the admissions/s its busiest primary would serve at one full core
(admissions over the busiest primary's CPU seconds): on a machine with fewer cores
than primaries plus clients, the wall-clock figure measures the machine, the ceiling
the layout.

Every hold names the tenant's account and its agent's (one of AGENTS); an escrowed
hold goes to the shard of its idempotency key, so both accounts are split over every
shard (routed by agent instead, 48 agents left the busiest primary 1.2-1.4x an even
share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from redis.asyncio import Redis

from irrev import output
from irrev.bench.background import primaries
from irrev.bench.rounds import compared, table
from irrev.cli import CliError, bounded
from irrev.localcluster import LocalCluster
from ledger import AccountSpec, Escrow, Ledger, LedgerError, cluster_enabled

HOUR_MS = 3_600_000
PRICE = 1_000
AGENTS = 48
ROUNDS = 3
# Limits no round comes near: the bench measures admissions, not denials.
TENANT_LIMIT = 10**14
AGENT_LIMIT = 10**12


@dataclass(frozen=True)
class EscrowRound:
    mode: str  # "one slot" or "escrow"
    admissions_per_s: float
    shares: list[float]  # each primary's share of the round's Redis CPU, busiest first
    ceiling_per_s: float  # admissions per CPU second of the busiest primary

    @property
    def spread(self) -> float:
        return self.shares[0] * len(self.shares) if self.shares else 0.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=bounded(float, 0.5, 600.0), default=3.0, help="per round")
    parser.add_argument(
        "--clients", type=bounded(int, 1, 1000), default=16, help="concurrent clients per process"
    )
    parser.add_argument("--processes", type=bounded(int, 1, 64), default=2, help="client processes")
    parser.add_argument(
        "--shards", type=bounded(int, 2, 64), default=3, help="escrow shards of the tenant"
    )
    parser.add_argument("--url", help="a Redis Cluster to use instead of a fresh local one")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.url and not cluster_enabled(args.url):
        raise CliError(f"--url {args.url}: not a Redis Cluster; escrow spreads over primaries")
    with _cluster(args.url) as url:
        rounds = asyncio.run(_measure(url, args))
    if args.json:
        print(
            json.dumps(
                {"rounds": [asdict(r) for r in rounds], "figures": figures(rounds)}, indent=2
            )
        )
    else:
        report(rounds, args)
    return 0


@contextmanager
def _cluster(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from irrev.faults.bench import cluster_binary

    with TemporaryDirectory(prefix="irrev-bench-escrow-") as root:
        cluster = LocalCluster(cluster_binary(), Path(root), replicas=0)
        try:
            cluster.start()
            yield cluster.url
        finally:
            cluster.stop()


async def _measure(url: str, args: argparse.Namespace) -> list[EscrowRound]:
    single, split = f"bench-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    ledger = Ledger.from_url(url)
    try:
        await ledger.load_scripts()
        escrow = await Escrow.split(ledger, split, args.shards)
        for spec in _accounts():
            await ledger.upsert_account(single, spec)
            await escrow.define(spec)
    finally:
        await ledger.aclose()
    nodes = await primaries(url)
    try:
        rounds = []
        for _ in range(ROUNDS):
            for mode, tenant in (("one slot", single), ("escrow", split)):
                rounds.append(await _round(url, nodes, mode, tenant, args))
        return rounds
    finally:
        for node in nodes:
            await node.aclose()


def _accounts() -> list[AccountSpec]:
    agents = [
        AccountSpec(account=f"agent:a{i}", limit=AGENT_LIMIT, soft_limit=AGENT_LIMIT)
        for i in range(AGENTS)
    ]
    return [
        AccountSpec(account="tenant:acme", limit=TENANT_LIMIT, soft_limit=TENANT_LIMIT),
        *agents,
    ]


async def _round(
    url: str, nodes: list[Redis], mode: str, tenant: str, args: argparse.Namespace
) -> EscrowRound:
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 2.0  # the processes import and connect first
    work = (url, mode, tenant, args.clients, start_at, args.seconds)
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(args.processes, mp_context=context) as pool:
        pending = [
            loop.run_in_executor(pool, _client_process, *work) for _ in range(args.processes)
        ]
        await asyncio.sleep(max(start_at - time.time(), 0))
        before = [await _cpu_s(node) for node in nodes]
        await asyncio.sleep(args.seconds)
        after = [await _cpu_s(node) for node in nodes]
        made = sum(await asyncio.wait_for(asyncio.gather(*pending), args.seconds + 120))
    used = sorted((b - a for a, b in zip(before, after, strict=True)), reverse=True)
    total = sum(used) or 1.0
    return EscrowRound(
        mode,
        made / args.seconds,
        [u / total for u in used],
        made / used[0] if used[0] else 0.0,
    )


async def _cpu_s(node: Redis) -> float:
    cpu = await node.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _client_process(
    url: str, mode: str, tenant: str, clients: int, start_at: float, seconds: float
) -> int:
    return asyncio.run(_clients(url, mode, tenant, clients, start_at, seconds))


async def _clients(
    url: str, mode: str, tenant: str, clients: int, start_at: float, seconds: float
) -> int:
    """Reserve+post pairs from `clients` clients between start_at and start_at +
    seconds (wall clock, shared by the processes); how many were admitted."""
    ledger = Ledger.from_url(url, max_connections=clients + 8)
    escrow = await Escrow.of(ledger, tenant) if mode == "escrow" else None
    prefix, made = uuid.uuid4().hex[:8], 0
    await asyncio.sleep(max(start_at - time.time(), 0))
    stop = start_at + seconds

    async def client(n: int) -> None:
        nonlocal made
        agent, i = f"agent:a{n % AGENTS}", 0
        amounts = {"tenant:acme": PRICE, agent: PRICE}
        while time.time() < stop:
            key, i = f"{prefix}-{n}-{i}", i + 1
            if escrow is None:
                result = await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
            else:
                result = await escrow.reserve(key, "fp", amounts, ttl_ms=HOUR_MS)
            if result.decision != "admit":
                raise RuntimeError(
                    f"{mode}: hold {key} was {result.decision} ({result.reason}) under "
                    f"limits no round comes near: {result.accounts}"
                )
            if escrow is None:
                await ledger.post(tenant, key, PRICE // 2)
            else:
                await escrow.post(key, PRICE // 2)
            made += 1

    offset = int(prefix, 16) % AGENTS
    try:
        await asyncio.gather(*(client(offset + n) for n in range(clients)))
    except LedgerError as exc:
        # Sent back to the bench as a plain exception: a ledger error's arguments do
        # not survive the pool's trip.
        raise RuntimeError(f"{mode}: {type(exc).__name__}: {exc}") from None
    finally:
        await ledger.aclose()
    return made


def figures(rounds: list[EscrowRound]) -> dict[str, dict[str, float]]:
    """Each mode's medians over its rounds, and escrow against one slot."""
    measures = {
        "admissions_per_s": lambda r: r.admissions_per_s,
        "spread": lambda r: r.spread,
        "ceiling_per_s": lambda r: r.ceiling_per_s,
    }
    return compared(rounds, "one slot", "escrow", measures)


def report(rounds: list[EscrowRound], args: argparse.Namespace) -> None:
    title = (
        f"one tenant's reserve+post, {args.processes} processes x {args.clients} clients: "
        f"all in one slot, then split over {args.shards} escrow shards, {ROUNDS} rounds in turn"
    )
    columns = ("mode", "admissions/s", "primaries' CPU shares", "spread", "ceiling/s")
    rows = [
        (
            r.mode,
            f"{r.admissions_per_s:,.0f}",
            " ".join(f"{share:.2f}" for share in r.shares),
            f"{r.spread:.2f}x",
            f"{r.ceiling_per_s:,.0f}",
        )
        for r in rounds
    ]
    console = output.console()
    console.print(table(title, columns, rows))
    found = figures(rounds)
    ratio, split = found["escrow_vs_one_slot"], found["escrow"]
    console.print(
        f"escrow vs one slot (medians): admissions/s x{ratio['admissions_per_s']:.2f}, "
        f"ceiling x{ratio['ceiling_per_s']:.2f} (issue 27's goal: admissions/s x2.5); "
        f"escrow's busiest primary {split['spread']:.2f}x an even share (goal: within 1.5x)"
    )
