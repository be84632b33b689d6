"""`irrev load`: the locust procurement profile (irrev/locustfile.py), headless, for a
bounded time and user count, against a local gateway with two workers; then requests
per second and p50/p95/p99 by decision, worker memory before and after, and the
checks that no account is over its limit and the ledger audit passes."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from irrev import output
from irrev.cli import bounded
from irrev.stack import gateway, render_policies, run_locust, supplier
from ledger import EmbeddedRedis, Ledger, audit_tenant

LOCUSTFILE = Path(__file__).resolve().parent.parent / "locustfile.py"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--users", type=bounded(int, 1, 1000), default=50, help="locust users (buying agents)"
    )
    parser.add_argument(
        "--spawn-rate",
        type=bounded(float, 0.1, 1000.0),
        default=25,
        help="users started per second until all run",
    )
    parser.add_argument(
        "--seconds", type=bounded(int, 1, 3600), default=30, help="bounded run time"
    )
    parser.add_argument(
        "--workers", type=bounded(int, 1, 64), default=2, help="the gateway's worker processes"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def worker_rss_mib(gateway_pid: int) -> list[float]:
    """Resident memory of each uvicorn worker (the children of `irrev serve`)."""
    children = psutil.Process(gateway_pid).children()
    return [round(c.memory_info().rss / 2**20, 1) for c in children if "python" in c.name()]


def run(args: argparse.Namespace) -> int:
    console = output.console(stderr=args.json)
    with tempfile.TemporaryDirectory(prefix="irrev-load-") as scratch:
        root = Path(scratch)
        with EmbeddedRedis(root / "redis") as redis, supplier() as upstream:
            policies = render_policies(root / "policies", upstream)
            with gateway(redis.url, policies, workers=args.workers) as server:
                before = worker_rss_mib(server.pid)
                tokens = {"IRREV_LOAD_TOKENS": str(policies / "procurement.tokens.yaml")}
                rows = run_locust(
                    LOCUSTFILE,
                    server.url,
                    args.users,
                    args.spawn_rate,
                    args.seconds,
                    root / "stats",
                    tokens,
                )
                after = worker_rss_mib(server.pid)
            ok = asyncio.run(check(console, redis.url, "acme"))
        if args.json:
            named = [row for row in rows if row["Name"] != "Aggregated"]
            result = {"rows": named, "rss_mib_before": before, "rss_mib_after": after, "ok": ok}
            print(json.dumps(result, indent=2))
        else:
            show(console, rows, before, after, args)
    return 0 if ok else 1


def show(
    console: Console,
    rows: list[dict[str, str]],
    before: list[float],
    after: list[float],
    args: argparse.Namespace,
) -> None:
    table = Table(title=f"irrev load: {args.users} users, {args.seconds} s, {args.workers} workers")
    for column in ("type", "name", "requests", "failures", "req/s", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(column, justify="left" if column in ("type", "name") else "right")
    # Locust's 'Aggregated' row would count each order twice (as a request and as a
    # decision), so only the named rows are shown.
    for row in rows:
        if row["Name"] != "Aggregated":
            table.add_row(
                row["Type"],
                row["Name"],
                row["Request Count"],
                row["Failure Count"],
                f"{float(row['Requests/s']):.1f}",
                row["50%"],
                row["95%"],
                row["99%"],
            )
    console.print(table)
    console.print(f"gateway worker RSS MiB before {before}, after {after}")


async def check(console: Console, redis_url: str, tenant: str) -> bool:
    ledger = Ledger.from_url(redis_url)
    try:
        over = [b.account for b in await ledger.balances(tenant) if b.used > b.limit]
        report = await audit_tenant(ledger, tenant)
    finally:
        await ledger.aclose()
    console.print(
        f"accounts over their limit: {', '.join(over) or 'none'}; "
        f"ledger audit: {'ok' if report.ok else report.mismatches}"
    )
    return not over and report.ok
