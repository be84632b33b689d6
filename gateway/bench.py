"""`irrev bench gateway`: admissions per second and latency through the proxy to a
local upstream, beside a bare FastAPI endpoint that does one Redis call and the same
forward (gateway/bench_baseline.py), under the same uvicorn settings, in one run.

Two measurements for each: a closed loop (C clients sending as fast as answers come:
throughput) and an open loop at a fixed rate (latency at that load; the added p99 is
irrev's minus the baseline's). Every request is a new order with its own key, priced
and admitted against a budget large enough never to refuse one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from ledger.embedded import EmbeddedRedis
from pricing import format_token, hash_token

from .stack import free_port, gateway, service, supplier, uvicorn_command

AGENTS = 16
BODY = b'{"supplier_id":"acme-steel","sku":"bolts","quantity":1,"unit_price":0.05}'

POLICY = """\
tenant: bench
risk_unit: {{currency: USD, scale: 1000000}}
window: 24h
soft_band: 1.0
escalation_ttl: 30m
hold_ttl: 10m
accounts:
  tenant: {{limit: "1000000000"}}
  principals:
    load: {{limit: "1000000000"}}
  risk_factors:
    "supplier:*": {{limit: "1000000000"}}
tools:
  supplier: {{upstream: "{upstream}"}}
routes:
  - tool: supplier
    route: POST /orders
    class: compensable
    body: [supplier_id, sku, quantity, unit_price]
    face_value: quantity * unit_price
    risk_factors: ["supplier:{{supplier_id}}"]
    pricing: {{model: quantile, recovery: {{alpha: 6, beta: 2}}, level: 0.999}}
agents:
{agents}
"""


@dataclass(frozen=True)
class Run:
    label: str
    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def register_bench(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = benches.add_parser("gateway", help="proxy admissions/s and latency vs a bare endpoint")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop concurrency")
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (both servers)")
    parser.set_defaults(func=run)


def bench_policy(directory: Path, upstream: str) -> list[str]:
    tokens = [format_token(os.urandom(32)) for _ in range(AGENTS)]
    agents = "".join(
        f'  bench-{i:02d}:\n    principal: load\n    token_sha256: "{hash_token(t)}"\n'
        f'    per_effect_cap: "1000000"\n    window_cap: "1000000000"\n'
        for i, t in enumerate(tokens)
    )
    directory.mkdir()
    (directory / "bench.yaml").write_text(POLICY.format(upstream=upstream, agents=agents))
    return tokens


@contextmanager
def baseline(redis_url: str, upstream: str, workers: int) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "IRREV_REDIS_URL": redis_url, "IRREV_BENCH_UPSTREAM": upstream}
    command = uvicorn_command(
        "gateway.bench_baseline:create_baseline", port, "--workers", str(workers)
    )
    with service(command, port, "/readyz", "the baseline server", env) as server:
        yield server.url


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="irrev-bench-") as scratch:
        root = Path(scratch)
        with EmbeddedRedis(root / "redis") as redis, supplier() as upstream:
            tokens = bench_policy(root / "policies", upstream)
            with (
                gateway(redis.url, root / "policies", workers=args.workers) as irrev,
                baseline(redis.url, upstream, args.workers) as base_url,
            ):
                results = asyncio.run(measure(irrev.url, base_url, tokens, args))
    report(results, args)
    return 0


async def measure(
    irrev_url: str, base_url: str, tokens: list[str], args: argparse.Namespace
) -> list[tuple[Run, Run]]:
    closed_irrev = await closed_loop("irrev", irrev_url, tokens, args, warmup=True)
    closed_base = await closed_loop("baseline", base_url, tokens, args, warmup=True)
    open_irrev = await open_loop("irrev", irrev_url, tokens, args)
    open_base = await open_loop("baseline", base_url, tokens, args)
    return [(closed_irrev, closed_base), (open_irrev, open_base)]


class Sender:
    def __init__(self, url: str, tokens: list[str], label: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=url, timeout=30, limits=httpx.Limits(max_connections=256)
        )
        self.tokens, self.label, self.sent = tokens, label, 0
        self.latencies: list[float] = []
        self.errors = 0

    async def send(self) -> None:
        self.sent += 1
        token = self.tokens[self.sent % len(self.tokens)]
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Idempotency-Key": f"{self.label}-{time.monotonic_ns()}-{self.sent}",
        }
        started = time.perf_counter()
        try:
            response = await self.http.post("/tools/supplier/orders", content=BODY, headers=headers)
            ok = response.status_code == 201
        except httpx.HTTPError:
            ok = False
        self.latencies.append(time.perf_counter() - started)
        self.errors += not ok

    def result(self, label: str, elapsed_s: float) -> Run:
        latencies = sorted(self.latencies)
        return Run(
            label,
            len(latencies) / elapsed_s,
            latencies[len(latencies) // 2] * 1000,
            latencies[int(len(latencies) * 0.99)] * 1000,
            self.errors,
        )


async def closed_loop(
    label: str, url: str, tokens: list[str], args: argparse.Namespace, warmup: bool
) -> Run:
    sender = Sender(url, tokens, label)
    try:
        if warmup:
            await asyncio.gather(*(sender.send() for _ in range(args.clients * 4)))
            sender.latencies.clear()
        stop = time.perf_counter() + args.seconds

        async def client() -> None:
            while time.perf_counter() < stop:
                await sender.send()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        return sender.result(
            f"{label}: {args.clients} clients, max rate", time.perf_counter() - started
        )
    finally:
        await sender.http.aclose()


async def open_loop(label: str, url: str, tokens: list[str], args: argparse.Namespace) -> Run:
    sender = Sender(url, tokens, label)
    try:
        interval, count = 1 / args.rate, int(args.rate * args.seconds)
        started = time.perf_counter()
        pending = []
        for i in range(count):
            delay = started + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(sender.send()))
        await asyncio.gather(*pending)
        return sender.result(
            f"{label}: open loop at {args.rate:g}/s", time.perf_counter() - started
        )
    finally:
        await sender.http.aclose()


def report(results: list[tuple[Run, Run]], args: argparse.Namespace) -> None:
    table = Table(title=f"irrev bench gateway ({args.workers} workers each, appendfsync always)")
    for column in ("measurement", "req/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for pair in results:
        for r in pair:
            table.add_row(
                r.label, f"{r.per_s:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors)
            )
    console = Console()
    console.print(table)
    (closed_irrev, closed_base), (open_irrev, open_base) = results
    console.print(
        f"throughput ratio irrev / baseline: {closed_irrev.per_s / closed_base.per_s:.2f} "
        f"(goal >= 0.6); added p99 at {args.rate:g}/s: "
        f"{open_irrev.p99_ms - open_base.p99_ms:+.2f} ms (goal < 5 ms)"
    )
