"""Escrow (ledger/escrow.py): a tenant split over shards, whose budget moves between
them by two-step transfers. Processes spending it (irrev/faults/escrow_worker.py, as
gateways would) are SIGKILLed, or lose Redis, between a transfer's steps, or reclaim
from one shard all at once. Whatever was cut off, recover() finishes it, and the
tenant holds no more than its limits: per account, unleased + slices + in flight =
the limit, and pending + posted over the shards <= it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence

from ledger import AccountSpec, Escrow

from ...harness import at_exit, forget
from ..bench import Run
from ..matrix import Cell

WORKERS = 3
OPS = 400
# Small enough that the shards refill and reclaim from each other throughout.
LIMITS = {"tenant:acme": 1500, "agent:shared": 800}
KILL_AFTER = 40  # admissions of the first worker
RECLAIMERS = 8


async def _escrowed(run: Run) -> Escrow:
    tenant = f"{run.tenant}-e"
    escrow = await Escrow.split(run.bench.ledger, tenant, 3)
    for account, limit in LIMITS.items():
        await escrow.define(AccountSpec(account=account, limit=limit, soft_limit=limit))
    return escrow


@contextlib.asynccontextmanager
async def _spenders(run: Run, escrow: Escrow) -> AsyncIterator[list[subprocess.Popen[str]]]:
    """The workers, released together once each has connected, and SIGKILLed when the
    block ends with any still running, or when the matrix exits or is sent SIGTERM
    meanwhile (harness.at_exit): they share its process group, so a CI timeout's
    SIGTERM to it alone would leave them spending (and retrying a killed Redis)."""
    barrier = f"{escrow.tenant}:barrier"
    argv = [sys.executable, "-m", "irrev.faults.escrow_worker", run.bench.redis_server.url]
    workers: list[subprocess.Popen[str]] = []
    exiting = at_exit(functools.partial(_signal, workers))
    try:
        for p in range(WORKERS):
            workers.append(
                subprocess.Popen(
                    [*argv, escrow.tenant, barrier, f"w{p}", str(OPS)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        redis = run.bench.ledger.redis
        for _ in workers:
            if await redis.blpop([f"{barrier}:ready"], timeout=60) is None:
                raise RuntimeError("an escrow worker did not start within 60 s")
        await redis.rpush(f"{barrier}:go", *["1"] * len(workers))
        yield workers
    finally:
        _kill(workers)
        forget(exiting)


async def _admitted(worker: subprocess.Popen[str], count: int) -> None:
    """Until `worker` has reported `count` admissions."""
    assert worker.stdout is not None and worker.stderr is not None
    for _ in range(count):
        if not await asyncio.to_thread(worker.stdout.readline):
            said = (await asyncio.to_thread(worker.stderr.read))[-400:]
            raise RuntimeError(f"an escrow worker ended before {count} admissions: {said}")


def _signal(workers: Sequence[subprocess.Popen[str]]) -> None:
    """SIGKILL to those still running (no wait: a thread may be reading their pipes)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)


def _kill(workers: Sequence[subprocess.Popen[str]]) -> None:
    """SIGKILL to those still running; each reaped, its pipes closed."""
    _signal(workers)
    for worker in workers:
        worker.communicate(timeout=30)


async def _finished(workers: Sequence[subprocess.Popen[str]]) -> list[str]:
    found = []
    for worker in workers:
        out, err = await asyncio.to_thread(worker.communicate, timeout=120)
        if worker.returncode != 0:
            found.append(f"a worker exited {worker.returncode}: {err[-300:]}")
        elif "admitted" not in json.loads(out.strip().splitlines()[-1]):
            found.append(f"a worker's report: {out[-200:]}")
    return found


async def _checked(run: Run, escrow: Escrow, *, recover: bool) -> list[str]:
    """The audit (after recover(), when asked), each account within its limit."""
    found: list[str] = []
    if recover:
        recovered = await escrow.recover()
        run.notes["recovered"] = recovered.grants + recovered.reclaims
        found += [f"stranded: {s}" for s in recovered.stranded]
    report = await escrow.audit()
    found += [f"audit: {m}" for m in report.mismatches]
    if report.in_flight:
        found.append(f"{report.in_flight} transfers still in flight")
    for account, limit in LIMITS.items():
        used = await escrow.used(account)
        if used > limit:
            found.append(f"{account}: {used} held over the shards, above its limit {limit}")
    return found


async def killed_mid_transfers(run: Run) -> list[str]:
    escrow = await _escrowed(run)
    async with _spenders(run, escrow) as workers:
        await _admitted(workers[0], KILL_AFTER)
    return await _checked(run, escrow, recover=True)


async def concurrent_reclaims(run: Run) -> list[str]:
    escrow = await _escrowed(run)
    taken = []
    async with _spenders(run, escrow) as workers:
        for _ in range(5):
            await _admitted(workers[0], 5)  # the shards hold slices by now
            taken += await asyncio.gather(
                *(escrow.reclaim(k % 3, "tenant:acme", 20) for k in range(RECLAIMERS))
            )
        found = await _finished(workers)
    run.notes["reclaimed"] = sum(taken)
    return found + await _checked(run, escrow, recover=False)


async def redis_killed_mid_transfers(run: Run) -> list[str]:
    escrow = await _escrowed(run)
    async with _spenders(run, escrow) as workers:
        await _admitted(workers[0], KILL_AFTER)
        await run.bench.kill_redis()
        await asyncio.sleep(0.3)
        await run.bench.restart_redis()
        found = await _finished(workers)
    return found + await _checked(run, escrow, recover=True)


CELLS = [
    Cell(
        name="escrow.killed_mid_transfers",
        checked="3 spenders SIGKILLed mid-refill and mid-reclaim -> recover(); audit; <= limits",
        body=killed_mid_transfers,
    ),
    Cell(
        name="escrow.concurrent_reclaims",
        checked="8 reclaims at once, 5 times, beside 3 spenders: audit exact, <= limits",
        body=concurrent_reclaims,
    ),
    Cell(
        name="escrow.redis_killed_mid_transfers",
        checked="kill -9 of every shard's primary mid-refill; spenders go on; recover(); audit",
        body=redis_killed_mid_transfers,
        standalone_only=True,
    ),
]
