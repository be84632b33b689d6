"""`irrev bench ledger`'s group commit figures (issue 27): reserve + post at
--clients concurrent clients through a ledger that sends each call alone and through
one with group commit (IRREV_GROUP_WAIT_MS, ledger/group.py), in turn, several
rounds in the same run. Each round counts the Redis process's CPU (INFO cpu of the
node of the tenant's slot) and the bench's own over the pairs it made: pairs/s, the
pairs a Redis core serves, and the client's CPU per pair."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import asdict, dataclass

from irrev import output
from irrev.bench.rounds import compared, table
from irrev.bench.servertime import HOUR_MS, PRICE, node_cpu_usec, tenant_node
from irrev.cli import bounded
from ledger import Ledger

ROUNDS = 3


@dataclass(frozen=True)
class GroupRound:
    mode: str  # "alone" or "grouped"
    pairs_per_s: float
    redis_cpu_us: float  # the Redis process's CPU per reserve+post
    client_cpu_us: float  # this process's CPU per reserve+post

    @property
    def pairs_per_core(self) -> float:
        return 1e6 / self.redis_cpu_us if self.redis_cpu_us else 0.0


async def _round(
    ledger: Ledger, mode: str, tenant: str, accounts: tuple[str, ...], clients: int, seconds: float
) -> GroupRound:
    prefix, made = uuid.uuid4().hex[:8], 0
    amounts = dict.fromkeys(accounts, PRICE)
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal made
        while time.perf_counter() < stop:
            key = f"g{prefix}-{made}"
            made += 1
            await ledger.reserve(tenant, key, "fp", amounts, ttl_ms=HOUR_MS)
            await ledger.post(tenant, key, PRICE // 2)

    node = tenant_node(ledger, tenant)
    redis_before = await node_cpu_usec(ledger.redis, node)
    client_before = time.process_time()
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    client_cpu = (time.process_time() - client_before) * 1e6
    redis_cpu = await node_cpu_usec(ledger.redis, node) - redis_before
    return GroupRound(mode, made / elapsed, redis_cpu / made, client_cpu / made)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--group-ms",
        type=bounded(float, 0.0, 10.0),
        default=1.0,
        help="also time --clients clients with group commit (IRREV_GROUP_WAIT_MS) against "
        "each call alone, in turn; 0 skips it",
    )


async def measure(
    url: str, tenant: str, accounts: tuple[str, ...], args: argparse.Namespace
) -> list[GroupRound]:
    """ROUNDS rounds of each mode, in turn (alone, grouped, alone, ...)."""
    clients, seconds, wait_ms = args.clients, args.seconds, args.group_ms
    ledgers = {
        "alone": Ledger.from_url(url, max_connections=clients + 4),
        "grouped": Ledger.from_url(url, max_connections=clients + 4, group_wait_ms=wait_ms),
    }
    try:
        for ledger in ledgers.values():
            await ledger.load_scripts()
        return [
            await _round(ledger, mode, tenant, accounts, clients, seconds)
            for _ in range(ROUNDS)
            for mode, ledger in ledgers.items()
        ]
    finally:
        for ledger in ledgers.values():
            await ledger.aclose()


def group_figures(rounds: list[GroupRound]) -> dict[str, dict[str, float]]:
    """Each mode's medians over its rounds, and grouped against alone."""
    measures = {
        "pairs_per_s": lambda r: r.pairs_per_s,
        "pairs_per_core": lambda r: r.pairs_per_core,
        "redis_cpu_us": lambda r: r.redis_cpu_us,
        "client_cpu_us": lambda r: r.client_cpu_us,
    }
    return compared(rounds, "alone", "grouped", measures)


def measurements(rounds: list[GroupRound], wait_ms: float) -> dict[str, object]:
    """What `report` shows, as data."""
    return {
        "wait_ms": wait_ms,
        "rounds": [{**asdict(r), "pairs_per_core": r.pairs_per_core} for r in rounds],
        "figures": group_figures(rounds),
    }


def report(rounds: list[GroupRound], clients: int, wait_ms: float) -> None:
    title = (
        f"{clients} clients: reserve+post alone and with group commit (<= {wait_ms:g} ms), "
        f"{ROUNDS} rounds each in turn"
    )
    columns = ("mode", "pairs/s", "Redis CPU us", "pairs/s per Redis core", "client CPU us")
    rows = [
        (
            r.mode,
            f"{r.pairs_per_s:,.0f}",
            f"{r.redis_cpu_us:.1f}",
            f"{r.pairs_per_core:,.0f}",
            f"{r.client_cpu_us:.0f}",
        )
        for r in rounds
    ]
    console = output.console()
    console.print(table(title, columns, rows))
    ratio = group_figures(rounds)["grouped_vs_alone"]
    console.print(
        f"group commit vs alone (medians): pairs/s per Redis core x{ratio['pairs_per_core']:.2f}"
        f" (issue 27's goal: x4), pairs/s x{ratio['pairs_per_s']:.2f}, client CPU per pair "
        f"x{ratio['client_cpu_us']:.2f}"
    )
