"""`irrev bench background`: the Redis commands per second a fleet of idle gateways
sends by itself (sweeps, leases, policy refreshes, webhook dispatch), at several
fleet sizes.

For each count of `--gateways` (default 1,4,16; up to 64), that many `irrev serve`
processes (one worker each, on 127.0.0.2, .3, ...: one "host" each, started
STARTING at a time) serve the same `--tenants` tenants (each with a webhook, which
an idle tenant never calls) on one Redis (an embedded one this command starts, or
`--redis-url`); after they settle, INFO commandstats is read twice `--seconds` apart
and the difference printed as commands/s (INFO and CONFIG themselves left out; on a
cluster, summed over its primaries), with the ratio to the first count: the baseline
of the same run, then the same by command (`--json`: one document with the same
figures). One sweeper and one webhook dispatcher per tenant (leases) do the
per-tenant work, and one process of the fleet (the watcher, gateway/state/fleetwatch.py)
the fleet-wide checks: a beat every 2 s, a look at every lease every 10 s, at the
policy epochs and versions every 30 s. A further host adds a subscription, which
costs Redis nothing while idle (the beats spare its PINGs): measure over a minute or
more (the default) to see the 30 s looks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from irrev.cli import CliError, bounded
from irrev.harness import PolicyDraft, Server
from ledger import EmbeddedRedis, cluster_enabled

EXAMPLE = Path("examples/procurement.yaml")
# After the last gateway is ready: long enough for the fleet to have a watcher
# (gateway/state/fleetwatch.py: taken WATCH_LAPSE_S after a process subscribes, and its first
# look makes every process re-read the store once), so what is measured is the
# steady state.
SETTLE_S = 12.0
# Gateways started at once: a start takes a core for seconds, and each must answer
# /readyz within the harness's START_TIMEOUT_S (60 s) on a machine of 2 cores.
STARTING = 4
# The bench's own reads, and a cluster's replicas acknowledging their primaries.
IGNORED = {"info", "config|resetstat", "config", "config|get", "replconf"}
# Never called: an idle tenant has no events to deliver.
HOOK_URL = "http://127.0.0.1:9/hooks"
HOOK_SECRET = "BENCH_WEBHOOK_SECRET"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateways", default="1,4,16", help="comma-separated fleet sizes (1 to 64 each)"
    )
    parser.add_argument(
        "--tenants", type=bounded(int, 1, 200), default=3, help="tenants every gateway serves"
    )
    parser.add_argument(
        "--seconds", type=bounded(float, 1, 600), default=60.0, help="measured per size"
    )
    parser.add_argument("--redis-url", help="measure on this Redis (default: an embedded one)")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.set_defaults(func=run)


def sizes(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or not all(1 <= n <= 64 for n in counts):
        raise CliError(f"--gateways {text!r}: give comma-separated counts from 1 to 64")
    return counts


def run(args: argparse.Namespace) -> int:
    counts = sizes(args.gateways)
    if not EXAMPLE.is_file():
        raise CliError(f"no {EXAMPLE} in {Path.cwd()}: run this from the irrev repository's root")
    with tempfile.TemporaryDirectory(prefix="irrev-bench-bg-") as scratch, ExitStack() as stack:
        root = Path(scratch)
        url = args.redis_url or stack.enter_context(EmbeddedRedis(root / "redis", tcp=True)).url
        policies = root / "policies"
        for i in range(args.tenants):
            policy = PolicyDraft.read(EXAMPLE).named(f"bg-{i}").fresh_tokens()
            policy.document["webhook"] = {"url": HOOK_URL, "secret": {"env": HOOK_SECRET}}
            policy.write(policies)
        if not args.json:
            print(f"idle gateways, {args.tenants} tenants, {args.seconds:g} s each, Redis {url}")
            print(f"{'gateways':>8} {'commands/s':>11} {'per gateway':>12} {'vs first':>9}   top")
        first = None
        seen: dict[int, Counter[str]] = {}
        for count in counts:
            calls = measure(url, policies, root, count, args.seconds)
            seen[count] = calls
            rate = sum(calls.values()) / args.seconds
            first = first or rate
            if not args.json:
                top = calls.most_common(4)
                shown = ", ".join(f"{name} {n / args.seconds:.1f}" for name, n in top)
                ratio = f"{rate / first:>8.2f}x"
                print(f"{count:>8} {rate:>11.1f} {rate / count:>12.1f} {ratio}   {shown}")
        if args.json:
            print(json.dumps(as_json(args, url, seen), indent=2))
        else:
            breakdown(seen, args.seconds)
    return 0


def as_json(args: argparse.Namespace, url: str, seen: dict[int, Counter[str]]) -> dict[str, object]:
    """The same figures as the table, per fleet size: commands/s in all and by command."""
    rates = {count: sum(calls.values()) / args.seconds for count, calls in seen.items()}
    first = next(iter(rates.values()), 0.0) or 1.0
    return {
        "tenants": args.tenants,
        "seconds": args.seconds,
        "redis": url,
        "sizes": [
            {
                "gateways": count,
                "commands_per_s": rates[count],
                "per_gateway": rates[count] / count,
                "vs_first": rates[count] / first,
                "by_command": {name: n / args.seconds for name, n in calls.most_common()},
            }
            for count, calls in seen.items()
        ],
    }


def breakdown(seen: dict[int, Counter[str]], seconds: float) -> None:
    """Commands/s by command at each fleet size: which part grows with the hosts."""
    names = sorted(set().union(*seen.values()), key=lambda n: -max(c[n] for c in seen.values()))
    print(f"\nby command (calls/s){''.join(f'{count:>9}' for count in seen)}")
    for name in names:
        row = "".join(f"{seen[count][name] / seconds:>9.1f}" for count in seen)
        print(f"{name:<20}{row}")


def measure(url: str, policies: Path, root: Path, count: int, seconds: float) -> Counter[str]:
    """Calls per command an idle fleet of `count` gateways sent in `seconds`."""
    env = {
        **os.environ,
        "IRREV_REDIS_URL": url,
        "IRREV_POLICY_DIR": str(policies),
        "IRREV_LOG_LEVEL": "warning",
        HOOK_SECRET: secrets.token_urlsafe(32),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    servers = [gateway(f"127.0.0.{2 + i}", env, root / f"gw-{count}-{i}.log") for i in range(count)]
    try:
        with ThreadPoolExecutor(max_workers=STARTING) as pool:
            list(pool.map(lambda server: server.start("/readyz"), servers))
        time.sleep(SETTLE_S)
        calls = asyncio.run(commands_during(url, seconds))
    finally:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda server: server.stop(), servers))
    return calls


def gateway(host: str, env: dict[str, str], log: Path) -> Server:
    server = Server(name=f"gateway {host}", argv=[], env=env, log_path=log, host=host)
    server.argv = [sys.executable, "-m", "irrev.cli", "serve", "--host", host]
    server.argv += ["--port", str(server.port), "--workers", "1"]
    return server


async def commands_during(url: str, seconds: float) -> Counter[str]:
    """Calls per command Redis served in `seconds` (INFO commandstats deltas), summed
    over every primary of a cluster: each tenant's work lands on its slot's node."""
    nodes = await primaries(url)
    try:
        before = await calls(nodes)
        await asyncio.sleep(seconds)
        after = await calls(nodes)
    finally:
        for node in nodes:
            await node.aclose()
    return after - before


async def primaries(url: str) -> list[Redis]:
    """A client of each primary of the cluster at `url`, or of `url` itself."""
    if not cluster_enabled(url):
        return [Redis.from_url(url, decode_responses=True)]
    cluster = RedisCluster.from_url(url)
    try:
        await cluster.initialize()
        return [
            Redis(host=node.host, port=int(node.port), decode_responses=True)
            for node in cluster.get_primaries()
        ]
    finally:
        await cluster.aclose()


async def calls(nodes: list[Redis]) -> Counter[str]:
    total: Counter[str] = Counter()
    for node in nodes:
        stats = await node.info("commandstats")
        for name, value in stats.items():
            command = name.removeprefix("cmdstat_")
            if command not in IGNORED:
                total[command] += int(value["calls"])
    return total
