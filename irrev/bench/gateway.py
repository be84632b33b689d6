"""`irrev bench gateway`: admissions per second, latency and server CPU per request
through the proxy to a local upstream, beside a peer: a FastAPI proxy with a
LiteLLM-style budget check (a GET and an INCRBYFLOAT in Redis) and the same forward
(irrev/bench/baseline.py), under the same uvicorn settings, in one run.

Two measurements for each, by locust (irrev/bench/benchfile.py, geventhttpclient: a Python
load generator that costs the servers less of the machine's two cores than httpx):
a closed loop (C users sending as fast as answers come: throughput) and a fixed
offered rate (latency at that load; the added p99 is irrev's minus the peer's).
Every request is a new order with its own key, priced and admitted against a budget
large enough never to refuse one. Each measurement also reads the CPU time (user and
system) the server's processes used while locust ran, per request answered: on two
shared cores a rate says as much about the load generator as about the server, and
the CPU a request costs does not. Each setting is measured `--rounds` times, the two
servers alternating; the CPU figure is all the rounds' CPU over all their requests,
and each round's ratio is printed beside it (other work on the machine moves a
single round's by 20% or more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from rich.table import Table

from irrev import output
from irrev.cli import CliError, bounded
from irrev.harness import PolicyDraft, Server, free_port, uvicorn_command
from irrev.stack import gateway, run_locust, service, supplier
from ledger import EmbeddedRedis

AGENTS = 16
# The peer's HTTP client (irrev/bench/baseline.py).
PEER_CLIENTS = ("httpx", "aiohttp")

POLICY = PolicyDraft.parse("""\
tenant: bench
risk_unit: {currency: USD, scale: 1000000}
window: 24h
soft_band: 1.0
escalation_ttl: 30m
hold_ttl: 10m
accounts:
  tenant: {limit: "1000000000"}
  principals:
    load: {limit: "1000000000"}
  risk_factors:
    "supplier:*": {limit: "1000000000"}
tools:
  supplier: {upstream: set-per-run}
routes:
  - tool: supplier
    route: POST /orders
    class: compensable
    body: [supplier_id, sku, quantity, unit_price]
    face_value: quantity * unit_price
    risk_factors: ["supplier:{supplier_id}"]
    pricing: {model: quantile, recovery: {alpha: 6, beta: 2}, level: 0.999}
agents: {}
""")


@dataclass(frozen=True)
class Run:
    label: str
    per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    # The server's CPU time (its processes, user + system) per request answered.
    cpu_ms: float
    requests: int
    cpu_ms_rounds: tuple[float, ...]


BENCHFILE = Path(__file__).resolve().parent / "benchfile.py"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=bounded(float, 1.0, 3600.0), default=5.0, help="per measurement"
    )
    parser.add_argument(
        "--clients", type=bounded(int, 1, 1000), default=32, help="closed-loop users"
    )
    parser.add_argument(
        "--rate", type=bounded(float, 1.0, 100_000.0), default=500.0, help="open-loop requests/s"
    )
    parser.add_argument(
        "--workers", type=bounded(int, 1, 64), default=2, help="uvicorn workers (both servers)"
    )
    parser.add_argument(
        "--rounds",
        type=bounded(int, 1, 20),
        default=3,
        help="measurements of each setting, alternating irrev and the peer",
    )
    parser.add_argument(
        "--peer-client",
        choices=PEER_CLIENTS,
        default="httpx",
        help="the peer's HTTP client: httpx's own transport, or the gateway's (httpx over "
        "aiohttp, as LiteLLM's HTTP handler sends) to leave the client out of the comparison",
    )
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.set_defaults(func=run)


def bench_policy(directory: Path, upstream: str) -> list[str]:
    policy = POLICY.copy().point(upstream)
    agent = {"principal": "load", "per_effect_cap": "1000000", "window_cap": "1000000000"}
    tokens = [policy.add_agent(f"bench-{i:02d}", **agent) for i in range(AGENTS)]
    policy.write(directory)
    return tokens


@contextmanager
def baseline(redis_url: str, upstream: str, workers: int, client: str) -> Iterator[Server]:
    port = free_port()
    env = {**os.environ, "IRREV_REDIS_URL": redis_url, "IRREV_BENCH_UPSTREAM": upstream}
    env["IRREV_BENCH_PEER_CLIENT"] = client
    command = uvicorn_command(
        "irrev.bench.baseline:create_baseline", port, "--workers", str(workers)
    )
    with service(command, port, "/readyz", "the peer server", env) as server:
        yield server


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="irrev-bench-") as scratch:
        root = Path(scratch)
        with EmbeddedRedis(root / "redis") as redis, supplier() as upstream:
            tokens = bench_policy(root / "policies", upstream)
            with (
                gateway(redis.url, root / "policies", workers=args.workers) as irrev,
                baseline(redis.url, upstream, args.workers, args.peer_client) as peer,
            ):
                results = measure(irrev, peer, tokens, args, root)
    report(results, args)
    return 0


def measure(
    irrev: Server, peer: Server, tokens: list[str], args: argparse.Namespace, scratch: Path
) -> list[tuple[Run, Run]]:
    """The peer and irrev alternate, `args.rounds` times, so a drift of the machine (on
    two cores shared with whatever else runs) hits both."""
    users = max(1, int(args.rate // 25))
    settings = (
        (f"{args.clients} users, no wait", args.clients, 0.0),
        (f"{args.rate:g}/s offered", users, args.rate / users),
    )
    results = []
    for n, (what, count, rate) in enumerate(settings):
        runs: dict[str, list[Run]] = {"irrev": [], "peer": []}
        for round_ in range(args.rounds):
            for label, server in (("peer", peer), ("irrev", irrev)):
                prefix = scratch / f"{n}-{label}-{round_}"
                run = locust_run(f"{label}: {what}", server, tokens, count, rate, args, prefix)
                runs[label].append(run)
        results.append((combined(runs["irrev"]), combined(runs["peer"])))
    return results


def combined(runs: list[Run]) -> Run:
    """One setting's rounds: the median rate and latencies, the CPU of all of them over
    all their requests, and each round's CPU per request."""
    requests = sum(r.requests for r in runs)
    return Run(
        runs[0].label,
        statistics.median(r.per_s for r in runs),
        statistics.median(r.p50_ms for r in runs),
        statistics.median(r.p99_ms for r in runs),
        sum(r.errors for r in runs),
        sum(r.cpu_ms * r.requests for r in runs) / requests,
        requests,
        tuple(r.cpu_ms for r in runs),
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process and its descendants (uvicorn's supervisor
    and its workers), as far as they are alive now."""
    root = psutil.Process(pid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def locust_run(
    label: str,
    server: Server,
    tokens: list[str],
    users: int,
    rate_per_user: float,
    args: argparse.Namespace,
    prefix: Path,
) -> Run:
    env = {"IRREV_BENCH_TOKENS": ",".join(tokens), "IRREV_BENCH_RATE": str(rate_per_user)}
    seconds = args.seconds
    cpu = cpu_seconds(server.pid)
    rows = run_locust(BENCHFILE, server.url, users, users, int(seconds), prefix, env)
    cpu = cpu_seconds(server.pid) - cpu
    row = next(r for r in rows if r["Name"] == "Aggregated")
    if row["50%"] == "N/A":
        # Locust writes N/A for the percentiles of a run that completed no request.
        raise CliError(
            f"{label}: no request completed in {seconds:g} s; give the run more --seconds"
        )
    return Run(
        label,
        float(row["Requests/s"]),
        float(row["50%"]),
        float(row["99%"]),
        int(row["Failure Count"]),
        cpu * 1000 / int(row["Request Count"]),
        int(row["Request Count"]),
        (cpu * 1000 / int(row["Request Count"]),),
    )


def report(results: list[tuple[Run, Run]], args: argparse.Namespace) -> None:
    (closed_irrev, closed_peer), (open_irrev, open_peer) = results
    if args.json:
        measured = {
            "workers": args.workers,
            "peer_client": args.peer_client,
            "runs": [asdict(r) for pair in results for r in pair],
            "throughput_ratio": closed_irrev.per_s / closed_peer.per_s,
            "rate": args.rate,
            "added_p99_ms": open_irrev.p99_ms - open_peer.p99_ms,
            "cpu_ratio": closed_irrev.cpu_ms / closed_peer.cpu_ms,
            "cpu_ratio_at_rate": open_irrev.cpu_ms / open_peer.cpu_ms,
        }
        print(json.dumps(measured, indent=2))
        return
    title = f"irrev bench gateway ({args.workers} workers each, appendfsync always, "
    title += f"median of {args.rounds} rounds, the peer on {args.peer_client})"
    table = Table(title=title)
    columns = ("measurement", "req/s", "p50 ms", "p99 ms", "errors", "server CPU ms/req")
    for column in columns:
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for pair in results:
        for r in pair:
            table.add_row(
                r.label,
                f"{r.per_s:,.0f}",
                f"{r.p50_ms:.2f}",
                f"{r.p99_ms:.2f}",
                str(r.errors),
                f"{r.cpu_ms:.2f}",
            )
    console = output.console()
    console.print(table)
    console.print(
        f"throughput ratio irrev / peer: {closed_irrev.per_s / closed_peer.per_s:.2f} "
        f"(goal >= 0.6); added p99 at {args.rate:g}/s: "
        f"{open_irrev.p99_ms - open_peer.p99_ms:+.2f} ms (goal < 5 ms)"
    )
    for what, irrev, peer in (
        (f"{args.clients} users", closed_irrev, closed_peer),
        (f"{args.rate:g}/s", open_irrev, open_peer),
    ):
        rounds = ", ".join(
            f"{i / p:.2f}" for i, p in zip(irrev.cpu_ms_rounds, peer.cpu_ms_rounds, strict=True)
        )
        console.print(
            f"server CPU per request, {what}: irrev {irrev.cpu_ms:.2f} ms, peer "
            f"{peer.cpu_ms:.2f} ms, irrev / peer {irrev.cpu_ms / peer.cpu_ms:.2f} "
            f"(goal <= 1.1; by round: {rounds})"
        )
