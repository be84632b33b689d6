"""IRREV_WAIT_AOF=local: every admission waits (WAITAOF) for the primary's AOF fsync
and, with IRREV_WAIT_REPLICAS, for replicas that fsynced it; a write not fsynced or
not replicated in time is released before anything is sent. Real `irrev serve`
processes on real Valkey servers (Redis 7.2's WAITAOF; Debian's Redis 7.0 lacks
it, and a gateway asked for it there refuses to start, as on a server whose AOF
or fsyncs are off)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from ledger import EmbeddedRedis
from tests.ledger.test_embedded import process_gone

from ..conftest import ReplicatedRedis, server_binary, valkey_binary
from .conftest import own_gateway
from .helpers import (
    assert_problem,
    balances,
    ledger_audit,
    orders_made,
    send_order,
    used,
)
from .servers import Server, base_env, write_policy
from .test_cli import bench_json
from .test_replicas import unreplicated_admissions
from .test_serve import refused_start

# Slow (Valkey primaries and replicas, waits of seconds): .ci/run runs it, README's test
# command does not (a fresh machine has no valkey-server to run it on).
pytestmark = pytest.mark.slow

WAIT_AOF = {"IRREV_WAIT_AOF": "local", "IRREV_WAIT_TIMEOUT_MS": "300"}


async def test_a_lost_replica_releases_admissions_that_wait_for_its_fsync(
    replicated_valkey: ReplicatedRedis,
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """IRREV_WAIT_AOF=all, WAITAOF 1 1: the primary fsynced each admission but no
    replica did once the replica was SIGKILLed: 503 not_replicated, released, nothing
    sent (the checks of tests/gateway/test_replicas.py), and admissions go through
    again once it is back. (A replica reports its fsyncs about once a second.)"""
    url = replicated_valkey.primary.url
    settings = {
        "IRREV_WAIT_AOF": "all",
        "IRREV_WAIT_REPLICAS": "1",
        "IRREV_WAIT_TIMEOUT_MS": "2500",
    }
    with own_gateway(url, suppliers, tmp_path, 1, **settings) as gateway:
        await unreplicated_admissions(
            gateway, upstream, replicated_valkey.replica.kill, replicated_valkey.attach
        )
        audit = ledger_audit(url, gateway.tenant("own"))
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.parametrize(
    ("setting", "off", "on"), [("appendfsync", "no", "always"), ("appendonly", "no", "yes")]
)
async def test_an_admission_the_primary_did_not_fsync_is_released(
    setting: str,
    off: str,
    on: str,
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """The primary's fsync turned off under a running gateway: with appendfsync no,
    WAITAOF's local count stays 0; with appendonly no, WAITAOF answers an error (it
    cannot count fsyncs of an AOF that is off), which acknowledged nothing (before:
    503 ledger_unavailable said nothing was admitted while the hold stayed pending and
    charged; failed here). Either way: 503 not_fsynced, released, never sent, the same
    answer for a repeat of the key, and admissions again once it is back on."""
    server = EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True)
    with server, own_gateway(server.url, suppliers, tmp_path, 1, **WAIT_AOF) as gateway:
        tenant = gateway.tenant("own")
        async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
            assert (await send_order(http, tenant, "o1")).status_code == 201
            before = used(await balances(http, gateway.admin, tenant))
            with redis.Redis.from_url(server.url) as admin:
                admin.config_set(setting, off)
                refused = assert_problem(await send_order(http, tenant, "o2"), 503, "not_fsynced")
                # A repeat of the key gets the same answer.
                again = await send_order(http, tenant, "o2")
                admin.config_set(setting, on)
            assert_problem(again, 503, "not_fsynced")
            assert again.headers["x-irrev-hold"] == refused["hold"]
            assert "x-irrev-decision" not in again.headers
            assert await orders_made(upstream, tenant) == 1  # nothing was sent
            assert used(await balances(http, gateway.admin, tenant)) == before  # released
            assert (await send_order(http, tenant, "o3")).status_code == 201
            assert await orders_made(upstream, tenant) == 2
        audit = ledger_audit(server.url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ("redis7", "the server has no WAITAOF"),
        ("appendonly no", "appendonly is no"),
        ("appendfsync no", "appendfsync is no"),
    ],
)
def test_a_server_that_cannot_wait_for_fsyncs_refuses_the_start(
    server: str, said: str, tmp_path: Path
) -> None:
    """Every write would fail, so the gateway does not start, with a line saying why
    and what to do, whatever IRREV_DURABILITY says (here the default, warn)."""
    binary = server_binary("redis7") if server == "redis7" else valkey_binary()
    with EmbeddedRedis(tmp_path / "redis", binary=binary, tcp=True) as redis_server:
        if server != "redis7":
            name = server.split()[0]
            with redis.Redis.from_url(redis_server.url) as client:
                client.config_set(name, "no")
        write_policy(tmp_path / "policies", "procurement", "fsyncs", "http://127.0.0.1:9")
        line = refused_start(
            "--workers",
            "1",
            IRREV_REDIS_URL=redis_server.url,
            IRREV_POLICY_DIR=str(tmp_path / "policies"),
            IRREV_WAIT_AOF="local",
        )
    assert said in line, line
    assert "unset IRREV_WAIT_AOF" in line, line


def test_an_embedded_redis_without_waitaof_refuses_the_start_and_is_stopped(
    tmp_path: Path,
) -> None:
    """The embedded Redis 6.2 `irrev serve` starts for itself has no WAITAOF: both
    workers refuse, the line is said once, and the redis-server is stopped too."""
    write_policy(tmp_path / "policies", "procurement", "fsyncs", "http://127.0.0.1:9")
    data_dir = tmp_path / "data"
    line = refused_start(
        "--workers",
        "2",
        IRREV_DATA_DIR=str(data_dir),
        IRREV_POLICY_DIR=str(tmp_path / "policies"),
        IRREV_WAIT_AOF="local",
    )
    assert "the server has no WAITAOF" in line, line
    started = re.findall(r"pid=(\d+)", (data_dir / "redis.log").read_text())
    assert started and all(process_gone(int(pid)) for pid in started)


def test_bench_ledger_times_reserve_and_post_with_and_without_waitaof() -> None:
    """The shortest --wait-aof run on an embedded Valkey, as JSON: both rows, each
    with its rate without WAITAOF measured in the same run."""
    short = ["--seconds", "0.1", "--script-calls", "10", "--memory-runs", "0", "--clients", "2"]
    binary = str(valkey_binary())
    report = bench_json("ledger", *short, "--wait-aof", "local", "--redis-server", binary)
    assert [row["ours"]["label"].split(":")[0] for row in report["wait_aof"]] == [
        "1 client(s)",
        "2 client(s)",
    ]
    assert all(row["ours"]["per_s"] > 0 and row["ratio"] > 0 for row in report["wait_aof"])


def test_bench_ledger_refuses_waitaof_on_a_server_without_it() -> None:
    short = ["--seconds", "0.1", "--script-calls", "10", "--memory-runs", "0", "--wait-aof", "all"]
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", "bench", "ledger", *short],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "--wait-aof: the server has no WAITAOF" in result.stderr, result.stderr
