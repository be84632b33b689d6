"""`irrev bench mcp`: MCP `tools/call` through irrev against the same call made directly
to the same MCP server, and through a peer proxy (FastMCP's, over one reused
session: irrev/bench/mcp_peer.py), in one run: calls per second with C concurrent
sessions (a closed loop), and the latency of one session calling back to back, whose
p50 and p99 each proxy adds. The server is irrev/upstreams/mcp_tools.py (SDK-built,
Streamable HTTP, deduplicating by key); every call is a new order with its own
idempotency key, admitted against a budget large enough never to refuse one. Agents
are the SDK's `mcp.Client`; what it costs is in every column. The peer runs as many
processes as irrev has workers, sessions spread over them as uvicorn spreads them
over workers. Each run also reads the CPU time its processes spent per call: the
proxy's (irrev's server and workers, or the peer's processes), the MCP server's, and
the agents' (this process): on one machine they share its cores, so what a call costs
each of them bounds how many calls the three can make together."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import RequestParamsMeta
from rich.table import Table

from irrev import output
from irrev.bench.gateway import cpu_seconds
from irrev.cli import bounded
from irrev.harness import PolicyDraft, Server, free_port
from irrev.stack import gateway, mcp_tools, service
from ledger import AppendFsync, EmbeddedRedis

KEY_META = "dev.irrev/idempotency_key"
UNLIMITED = {"limit": "1000000000"}
CPU_FIELDS = ("proxy_cpu_ms_per_call", "tool_cpu_ms_per_call", "agents_cpu_ms_per_call")
AGENT = {"principal": "load", "per_effect_cap": "1000000", "window_cap": "1000000000"}


def bench_policy(directory: Path, mcp_url: str, sessions: int) -> list[str]:
    """One tenant whose budget never refuses, `sessions` agents; returns their tokens."""
    policy = PolicyDraft(
        {
            "tenant": "bench-mcp",
            "risk_unit": {"currency": "USD", "scale": 1000000},
            "window": "24h",
            "soft_band": 1.0,
            "escalation_ttl": "30m",
            "hold_ttl": "10m",
            "accounts": {
                "tenant": UNLIMITED,
                "principals": {"load": UNLIMITED},
                "risk_factors": {"supplier:*": UNLIMITED},
            },
            "tools": {"procure": {"mcp": mcp_url}},
            "routes": [
                {
                    "tool": "procure",
                    "route": "CALL procure/place_order",
                    "class": "compensable",
                    "body": ["supplier_id", "sku", "quantity", "unit_price"],
                    "face_value": "quantity * unit_price",
                    "risk_factors": ["supplier:{supplier_id}"],
                    "pricing": {"model": "quantile", "recovery": {"alpha": 6, "beta": 2}},
                }
            ],
        }
    )
    tokens = [policy.add_agent(f"bench-{i:02d}", **AGENT) for i in range(sessions)]
    policy.write(directory)
    return tokens


ORDER = {"supplier_id": "s1", "sku": "bolts", "quantity": 2, "unit_price": "10"}


@dataclass(frozen=True)
class Measured:
    calls: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    # CPU time (user + system) over the run: the proxy's processes (0 for direct
    # calls), the MCP server's, and the agents' (this process).
    proxy_cpu_s: float = 0.0
    tool_cpu_s: float = 0.0
    agents_cpu_s: float = 0.0

    @property
    def cpu_ms_per_call(self) -> tuple[float, float, float]:
        """The proxy's, the MCP server's and the agents' CPU per call, in ms."""
        per_call = 1000 / self.calls if self.calls else 0.0
        return (
            self.proxy_cpu_s * per_call,
            self.tool_cpu_s * per_call,
            self.agents_cpu_s * per_call,
        )

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=bounded(float, 1.0, 600.0), default=5.0, help="per measurement"
    )
    parser.add_argument(
        "--sessions", type=bounded(int, 1, 200), default=16, help="concurrent MCP sessions"
    )
    parser.add_argument("--workers", type=bounded(int, 1, 64), default=2, help="irrev workers")
    parser.add_argument(
        "--appendfsync",
        choices=[m.value for m in AppendFsync],
        default=AppendFsync.ALWAYS.value,
        help="the ledger's embedded Redis's (default always, the ledger's own default): "
        "with always, each reserve and post waits for the disk",
    )
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.set_defaults(func=run)


@asynccontextmanager
async def session(url: str, token: str = "") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0, trust_env=False) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as client,
    ):
        yield client


async def closed_loop(urls: list[str], tool: str, tokens: list[str], seconds: float) -> Measured:
    """Each session (one per token, the i-th on urls[i % len(urls)]) calls back to back
    until `seconds` have passed."""
    latencies: list[float] = []
    errors = 0

    async def one(url: str, token: str) -> None:
        nonlocal errors
        async with session(url, token) as client:
            await client.list_tools()  # what an agent does first; not measured
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                meta: RequestParamsMeta = {KEY_META: uuid.uuid4().hex}  # type: ignore[misc]
                result = await client.session.call_tool(tool, ORDER, meta=meta)
                latencies.append((time.perf_counter() - started) * 1000)
                errors += int(result.is_error)

    started = time.monotonic()
    await asyncio.gather(*(one(urls[i % len(urls)], token) for i, token in enumerate(tokens)))
    return Measured(len(latencies), errors, time.monotonic() - started, latencies)


@dataclass(frozen=True)
class Side:
    """What one side of the comparison calls: its URLs and tool name, and the process
    trees whose CPU is its proxy's (none for direct calls)."""

    urls: list[str]
    tool: str
    proxy_pids: list[int]


async def timed_loop(side: Side, tool_pid: int, tokens: list[str], seconds: float) -> Measured:
    """closed_loop, with the CPU its proxy, the MCP server and the agents spent."""

    def cpu() -> tuple[float, float, float]:
        own = os.times()
        proxy = sum(cpu_seconds(pid) for pid in side.proxy_pids)
        return proxy, cpu_seconds(tool_pid), own.user + own.system

    before = cpu()
    measured = await closed_loop(side.urls, side.tool, tokens, seconds)
    proxy, tool, agents = (b - a for a, b in zip(before, cpu(), strict=True))
    return replace(measured, proxy_cpu_s=proxy, tool_cpu_s=tool, agents_cpu_s=agents)


async def measure(
    sides: dict[str, Side], tool_pid: int, tokens: list[str], args: argparse.Namespace
) -> dict[str, Measured]:
    """Direct, the peer and irrev alternate, so a drift of the machine hits all three."""
    many = args.sessions
    results = {}
    for label, count in (("1 session", 1), (f"{many} sessions", many)):
        for name, side in sides.items():
            agents = tokens[:count] if name == "irrev" else [""] * count
            results[f"{name}, {label}"] = await timed_loop(side, tool_pid, agents, args.seconds)
    return results


@contextmanager
def peer_proxies(upstream: str, processes: int, scratch: Path) -> Iterator[list[Server]]:
    """`processes` FastMCP proxies (irrev/bench/mcp_peer.py) in front of `upstream`."""
    with ExitStack() as stack:
        servers = []
        for i in range(processes):
            port = free_port()
            command = [sys.executable, "-m", "irrev.bench.mcp_peer", "--port", str(port)]
            command += ["--upstream", upstream]
            log = scratch / f"peer-{i}.log"
            servers.append(stack.enter_context(service(command, port, "/ready", "peer", None, log)))
        yield servers


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="irrev-bench-mcp-") as scratch:
        root = Path(scratch)
        with (
            EmbeddedRedis(root / "redis", appendfsync=AppendFsync(args.appendfsync)) as redis,
            mcp_tools(root / "tool-state") as tools,
        ):
            direct = f"{tools.url}/bench/mcp"
            tokens = bench_policy(root / "policies", direct, args.sessions)
            with (
                gateway(redis.url, root / "policies", workers=args.workers) as irrev,
                peer_proxies(direct, args.workers, root) as peers,
            ):
                sides = {
                    "direct": Side([direct], "place_order", []),
                    "peer": Side(
                        [f"{p.url}/mcp" for p in peers], "place_order", [p.pid for p in peers]
                    ),
                    "irrev": Side([f"{irrev.url}/mcp"], "procure__place_order", [irrev.pid]),
                }
                results = asyncio.run(measure(sides, tools.pid, tokens, args))
    report(results, args)
    return 0


@dataclass(frozen=True)
class Ratios:
    """The run's comparisons: calls/s through irrev over direct and over the peer at C
    sessions; the p50 and p99 one session's calls gain through irrev and through the
    peer, and irrev's added p50 over the peer's."""

    irrev_direct: float
    irrev_peer: float
    added_p50_ms: float
    added_p99_ms: float
    peer_added_p50_ms: float
    peer_added_p99_ms: float

    @property
    def added_p50_vs_peer(self) -> float:
        return self.added_p50_ms / self.peer_added_p50_ms if self.peer_added_p50_ms > 0 else 0.0

    @classmethod
    def of(cls, results: dict[str, Measured]) -> Ratios:
        one_direct, one_peer, one_irrev, many_direct, many_peer, many_irrev = results.values()
        return cls(
            many_irrev.per_s / many_direct.per_s,
            many_irrev.per_s / many_peer.per_s,
            one_irrev.quantile(0.5) - one_direct.quantile(0.5),
            one_irrev.quantile(0.99) - one_direct.quantile(0.99),
            one_peer.quantile(0.5) - one_direct.quantile(0.5),
            one_peer.quantile(0.99) - one_direct.quantile(0.99),
        )


def report(results: dict[str, Measured], args: argparse.Namespace) -> None:
    ratios = Ratios.of(results)
    if args.json:
        runs = [
            {
                "run": label,
                "calls_per_s": m.per_s,
                "p50_ms": m.quantile(0.5),
                "p99_ms": m.quantile(0.99),
                "errors": m.errors,
                **dict(zip(CPU_FIELDS, m.cpu_ms_per_call, strict=True)),
            }
            for label, m in results.items()
        ]
        measured = {
            "workers": args.workers,
            "appendfsync": args.appendfsync,
            "sessions": args.sessions,
            "runs": runs,
            "throughput_ratio": ratios.irrev_direct,
            "peer_throughput_ratio": ratios.irrev_peer,
            "added_p50_ms": ratios.added_p50_ms,
            "added_p99_ms": ratios.added_p99_ms,
            "peer_added_p50_ms": ratios.peer_added_p50_ms,
            "peer_added_p99_ms": ratios.peer_added_p99_ms,
            "added_p50_vs_peer": ratios.added_p50_vs_peer,
        }
        print(json.dumps(measured, indent=2))
        return
    title = (
        f"MCP tools/call, {args.seconds:g} s each, irrev with {args.workers} workers "
        f"(its Redis with appendfsync {args.appendfsync}), "
        f"the peer (FastMCP's proxy, one reused session) with {args.workers} processes"
    )
    table = Table(title=title)
    columns = ("run", "calls/s", "p50 ms", "p99 ms", "errors")
    for column in (*columns, "CPU ms/call: proxy", "MCP server", "agents"):
        table.add_column(column, justify="right")
    for label, m in results.items():
        p50, p99 = m.quantile(0.5), m.quantile(0.99)
        table.add_row(
            label,
            f"{m.per_s:.1f}",
            f"{p50:.1f}",
            f"{p99:.1f}",
            str(m.errors),
            *(f"{ms:.2f}" for ms in m.cpu_ms_per_call),
        )
    console = output.console()
    console.print(table)
    console.print(
        f"calls/s at {args.sessions} sessions: irrev/direct {ratios.irrev_direct:.2f}, "
        f"irrev/peer {ratios.irrev_peer:.2f}; added latency of one session: irrev p50 "
        f"+{ratios.added_p50_ms:.1f} ms, p99 +{ratios.added_p99_ms:.1f} ms; peer p50 "
        f"+{ratios.peer_added_p50_ms:.1f} ms, p99 +{ratios.peer_added_p99_ms:.1f} ms; "
        f"irrev's added p50 / the peer's: {ratios.added_p50_vs_peer:.2f}"
    )
    direct, peer, irrev = (m.cpu_ms_per_call for m in list(results.values())[3:])
    console.print(
        f"CPU per call at {args.sessions} sessions: irrev {irrev[0]:.2f} ms, the peer "
        f"{peer[0]:.2f} ms; of a direct call, the MCP server {direct[1]:.2f} ms and the "
        f"agents {direct[2]:.2f} ms (Redis not counted)"
    )
