"""The audit replays the journal and finds what does not match; the CLI says so with
its exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.keys import account_key, hold_key

from .conftest import open_accounts

HOUR_MS = 3_600_000


async def busy_tenant(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000, agent_a=5_000)
    both = ("tenant:acme", "agent:a")
    for i in range(20):
        await ledger.reserve(tenant, f"k{i}", "fp", {a: 100 + i for a in both}, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "k0", 50)
    await ledger.post(tenant, "k1", 500)
    await ledger.void(tenant, "k2")
    await ledger.mark_ambiguous(tenant, "k3", "upstream_timeout")
    await ledger.compensate(tenant, "k1", 200)


async def test_clean_ledger_passes(ledger: Ledger, tenant: str) -> None:
    await busy_tenant(ledger, tenant)
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches
    assert (report.accounts, report.live_holds) == (2, 17)
    assert report.entries == 2 + 20 + 5


async def test_tampered_balance_is_reported(ledger: Ledger, tenant: str) -> None:
    await busy_tenant(ledger, tenant)
    await ledger.redis.hincrby(account_key(tenant, "agent:a"), "post", -7)
    report = await audit_tenant(ledger, tenant)
    assert len(report.mismatches) == 1
    assert "agent:a" in report.mismatches[0] and "posted" in report.mismatches[0]


async def test_hold_lost_behind_the_journal_is_reported(ledger: Ledger, tenant: str) -> None:
    await busy_tenant(ledger, tenant)
    await ledger.redis.delete(hold_key(tenant, "k5"))
    report = await audit_tenant(ledger, tenant)
    assert any("hold k5" in m for m in report.mismatches)
    assert any("live holds charge" in m for m in report.mismatches)


async def test_cli_audit_exit_codes(ledger: Ledger, tenant: str, redis_url: str) -> None:
    await busy_tenant(ledger, tenant)
    env = {**os.environ, "IRREV_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "irrev.cli", "ledger", "audit", "--tenant", tenant]
    clean = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"{tenant}: 27 journal entries, 2 accounts, 17 live holds: ok" in clean.stdout
    await ledger.redis.hincrby(account_key(tenant, "tenant:acme"), "pend", 1)
    broken = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert broken.returncode == 1
    assert "1 MISMATCHES" in broken.stdout and "tenant:acme" in broken.stdout


async def test_cli_balance_and_journal(ledger: Ledger, tenant: str, redis_url: str) -> None:
    await busy_tenant(ledger, tenant)
    env = {**os.environ, "IRREV_REDIS_URL": redis_url, "COLUMNS": "200"}
    base = [sys.executable, "-m", "irrev.cli", "ledger"]
    balance = subprocess.run(
        [*base, "balance", "--tenant", tenant], env=env, capture_output=True, text=True, timeout=60
    )
    assert balance.returncode == 0, balance.stderr
    assert "agent:a" in balance.stdout and "tenant:acme" in balance.stdout
    journal = subprocess.run(
        [*base, "journal", "--tenant", tenant, "--json", "--count", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert journal.returncode == 0, journal.stderr
    assert len(journal.stdout.splitlines()) == 5
    missing = subprocess.run(
        [*base, "balance", "--tenant", tenant, "agent:nobody"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "agent:nobody" in missing.stderr


@pytest.mark.parametrize(
    ("argv", "url", "says"),
    [
        (["balance", "--tenant", "a b"], None, "tenant: must be 1-64 characters"),
        (["journal", "--tenant", "x/../y"], None, "tenant: must be 1-64 characters"),
        (["trim", "--tenant", "ok", "--archive", "a", "--older-than-s", "-5"], None, ">= 0"),
        (["audit"], "unix:///nonexistent/redis.sock", "Redis"),
        (["balance", "--tenant", "ok"], "unix:///nonexistent/redis.sock", "IRREV_REDIS_URL"),
    ],
)
def test_cli_bad_input_is_one_line(
    redis_url: str, argv: list[str], url: str | None, says: str
) -> None:
    env = {**os.environ, "IRREV_REDIS_URL": url or redis_url}
    command = [sys.executable, "-m", "irrev.cli", "ledger", *argv]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert says in result.stderr.strip().splitlines()[-1]
