"""Contract 1, 2 and 5 under real contention: separate OS processes, each with its
own connections, released at once by a barrier in Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.records import AccountSpec, HoldState

from .conftest import open_accounts

ROOT = Path(__file__).resolve().parents[2]


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ledger.workers", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def release(ledger: Ledger, name: str, count: int) -> None:
    for _ in range(count):
        assert await ledger.redis.blpop([f"{name}:ready"], timeout=60) is not None
    await ledger.redis.rpush(f"{name}:go", *["1"] * count)


def finish(processes: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each worker's report: the JSON it printed (tests/ledger/workers.py)."""
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results.append(json.loads(out))
    return results


def kill_mid_storm(workers: list[subprocess.Popen[str]], done: int) -> None:
    """SIGKILL the first worker once it has reported `done` operations on stdout, then
    the others: a storm cut off mid-operation."""
    victim = workers[0]
    assert victim.stdout is not None
    for _ in range(done):
        assert victim.stdout.readline()
    os.kill(victim.pid, signal.SIGKILL)
    for worker in workers[1:]:
        worker.send_signal(signal.SIGKILL)
    for worker in workers:
        worker.communicate(timeout=30)
        assert worker.returncode == -signal.SIGKILL


async def test_never_overdraw_under_contention(ledger: Ledger, tenant: str, redis_url: str) -> None:
    processes, reserves, price = 8, 200, 7
    tenant_limit, agent_limit = 3000, 700  # floor(3000 / 7) = 428 admissions in all
    await open_accounts(ledger, tenant, tenant_acme=tenant_limit)
    for p in range(processes):
        await open_accounts(ledger, tenant, **{f"agent_w{p}": agent_limit})
    name = f"{tenant}:barrier"
    workers = [
        spawn("storm", redis_url, tenant, name, f"w{p}", str(reserves), str(price), "8")
        for p in range(processes)
    ]
    await release(ledger, name, processes)
    results = finish(workers)

    admitted = sum(int(r["admitted"]) for r in results)
    assert admitted == tenant_limit // price
    assert sum(int(r["denied"]) for r in results) == processes * reserves - admitted
    for balance in await ledger.balances(tenant):
        assert balance.used <= balance.limit
        assert balance.pending % price == 0
    tenant_balance = await ledger.balance(tenant, "tenant:acme")
    assert tenant_balance is not None and tenant_balance.pending == admitted * price
    for result in results:
        agent = await ledger.balance(tenant, f"agent:{result['agent']}")
        assert agent is not None and agent.pending == int(result["admitted"]) * price
    assert (await audit_tenant(ledger, tenant)).mismatches == []


async def test_agent_limits_bind_under_contention(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    processes, reserves, price = 8, 200, 10
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    for p in range(processes):
        await open_accounts(ledger, tenant, **{f"agent_w{p}": 555 + p})
    name = f"{tenant}:barrier"
    workers = [
        spawn("storm", redis_url, tenant, name, f"w{p}", str(reserves), str(price), "8")
        for p in range(processes)
    ]
    await release(ledger, name, processes)
    for result in finish(workers):
        p = int(str(result["agent"])[1:])
        assert result["admitted"] == (555 + p) // price


async def test_consume_once_approval_with_racing_processes(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=0)
    )
    escalated = await ledger.reserve(tenant, "big", "fp", {"tenant:acme": 900}, ttl_ms=60_000)
    assert escalated.state is HoldState.ESCALATED
    name = f"{tenant}:barrier"
    racers = [spawn("approve", redis_url, tenant, name, "big", f"admin{i}") for i in range(12)]
    await release(ledger, name, len(racers))
    results = finish(racers)

    winners = [r["who"] for r in results if r["won"]]
    assert len(winners) == 1
    for loser in (r for r in results if not r["won"]):
        assert (loser["state"], loser["by"]) == ("pending", winners[0])
    hold = await ledger.hold(tenant, "big")
    assert hold is not None and (hold.state, hold.by) == (HoldState.PENDING, winners[0])
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None and balance.pending == 900


async def test_sigkilled_client_leaves_no_partial_hold(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=50_000)
    for p in range(4):
        await open_accounts(ledger, tenant, **{f"agent_c{p}": 20_000})
    name = f"{tenant}:barrier"
    workers = [spawn("churn", redis_url, tenant, name, f"c{p}", "100000") for p in range(4)]
    await release(ledger, name, len(workers))
    kill_mid_storm(workers, 300)

    report = await audit_tenant(ledger, tenant)
    assert report.mismatches == []
    assert report.entries > 300
    for balance in await ledger.balances(tenant):
        assert balance.used <= balance.limit
