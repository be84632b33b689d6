"""The gateway's start probe of its waits (a write, then the WAITAOF/WAIT every kept
write gets), and what tells WAITAOF from WAIT: a replica that receives writes but
does not fsync them (appendonly no) passes WAIT and fails WAITAOF 1 1. Real
`irrev serve` processes on real Valkey servers (Redis 7.0 lacks WAITAOF)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from ledger import EmbeddedRedis, free_port

from ..conftest import ReplicatedRedis, valkey_binary
from .conftest import own_gateway
from .helpers import assert_problem, deploy_hold, effect_headers, order
from .servers import BIN, Server, base_env, write_policy
from .test_replicas import unreplicated_admissions

# Slow (Valkey primaries and replicas, waits of seconds): .ci/run runs it, README's test
# command does not (a fresh machine has no valkey-server to run it on).
pytestmark = pytest.mark.slow

PASSWORD = "probe-pw"


def start_gateway(redis_url: str, root: Path, **settings: str) -> Server:
    """`irrev serve` (one worker) on `redis_url`, not started yet."""
    policies = root / "policies"
    policies.mkdir(parents=True, exist_ok=True)
    write_policy(policies, "procurement", "probe", "http://127.0.0.1:9")
    env = base_env(IRREV_REDIS_URL=redis_url, IRREV_POLICY_DIR=str(policies), **settings)
    gateway = Server(
        name="gateway", argv=[str(BIN / "irrev"), "serve"], env=env, log_path=root / "gw.log"
    )
    gateway.argv += ["--port", str(gateway.port), "--workers", "1"]
    return gateway


def refused_start(redis_url: str, root: Path, **settings: str) -> str:
    """The log of a gateway that exited at start."""
    gateway = start_gateway(redis_url, root, **settings)
    with pytest.raises(Exception, match="exited"):
        gateway.start("/readyz")
    return gateway.log(20_000)


def user_url(server: EmbeddedRedis, user: str, *denied: str) -> str:
    """The URL of a new ACL user of `server` allowed everything but `denied`."""
    with redis.Redis.from_url(server.url) as admin:
        rules = ["on", f">{PASSWORD}", "~*", "&*", "+@all", *(f"-{c}" for c in denied)]
        admin.execute_command("ACL", "SETUSER", user, *rules)
    parts = urlsplit(server.url)
    return f"redis://{user}:{PASSWORD}@{parts.hostname}:{parts.port}/0"


@pytest.mark.parametrize(
    ("denied", "said", "not_said"),
    [
        # WAITAOF itself: a gateway restarted on a tenant whose accounts were written
        # passed the version check and then failed every admission (it started before).
        ("waitaof", ["WAITAOF was refused", "no permissions", "unset IRREV_WAIT_AOF"], None),
        # The probe's own write (SET), which a least-privilege user may not run: the
        # refusal names the grant (it read as a server without WAITAOF, whose advice,
        # to upgrade Redis or turn the AOF on, was wrong).
        ("set", ["+set ~irrev:probe:*", "Redis refused the call"], "run Redis 7.2+"),
    ],
)
def test_a_user_denied_what_the_probe_runs_refuses_the_start(
    denied: str, said: list[str], not_said: str | None, tmp_path: Path
) -> None:
    """The server has WAITAOF (Valkey 8) but the ledger's Redis user may not run what
    the probe runs: the start is refused with a line saying what and what to do."""
    with EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True) as server:
        first = start_gateway(server.url, tmp_path, IRREV_WAIT_AOF="local")
        first.start("/readyz")
        first.stop()
        url = user_url(server, f"no{denied}", denied)
        log = refused_start(url, tmp_path, IRREV_WAIT_AOF="local")
    assert all(part in log for part in said), log
    assert not_said is None or not_said not in log, log


def test_a_probed_fsync_meets_require_where_config_is_refused(tmp_path: Path) -> None:
    """CONFIG GET refused (a managed Redis's ACL): the persistence settings are
    unknown, so IRREV_DURABILITY=require refused the start even with
    IRREV_WAIT_AOF=local, whose WAITAOF proves each write's fsync (refused before).
    Now the probe's fsync satisfies it; without WAITAOF the start is still refused."""
    with EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True) as server:
        url = user_url(server, "noconfig", "config")
        gateway = start_gateway(url, tmp_path, IRREV_WAIT_AOF="local", IRREV_DURABILITY="require")
        gateway.start("/readyz")
        gateway.stop()
        log = refused_start(url, tmp_path, IRREV_DURABILITY="require")
    assert "could not be read (CONFIG GET refused)" in log, log


@contextmanager
def replica_without_aof(primary: EmbeddedRedis, root: Path) -> Iterator[str]:
    """A Valkey replica of `primary` started with appendonly no (the primary's AOF
    is on): it receives and acknowledges every write (WAIT) but fsyncs none
    (WAITAOF). Yields its URL once it is in sync."""
    port = free_port()
    data = root / "replica-no-aof"
    data.mkdir()
    primary_port = str(urlsplit(primary.url).port)
    argv = [str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    argv += ["--appendonly", "no", "--save", "", "--replicaof", "127.0.0.1", primary_port]
    with open(root / "replica-no-aof.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with redis.Redis.from_url(url, decode_responses=True) as replica:
                    if replica.info("replication").get("master_link_status") == "up":
                        break
            except redis.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


async def test_a_replica_that_does_not_fsync_passes_wait_and_not_waitaof_all(
    suppliers: Server, upstream: httpx.AsyncClient, tmp_path: Path
) -> None:
    """A replica started with appendonly no holds every write in memory only: WAIT
    counts it (IRREV_WAIT_AOF=off, IRREV_WAIT_REPLICAS=1: admitted, 201), WAITAOF 1 1
    does not. With IRREV_WAIT_AOF=all the gateway refuses to start (its probe),
    where before it started and refused every admission. (The tests that SIGKILL a
    replica do not tell the two apart: WAIT catches that too.)"""
    with (
        EmbeddedRedis(tmp_path / "primary", binary=valkey_binary(), tcp=True) as primary,
        replica_without_aof(primary, tmp_path),
    ):
        waits = {"IRREV_WAIT_REPLICAS": "1", "IRREV_WAIT_TIMEOUT_MS": "2500"}
        with own_gateway(primary.url, suppliers, tmp_path, 1, **waits) as gateway:
            tenant = gateway.tenant("own")
            async with httpx.AsyncClient(base_url=gateway.url, trust_env=False) as http:
                admitted = await http.post(
                    "/tools/supplier/orders",
                    json=order(),
                    headers=effect_headers(tenant, "buyer-01", "o1"),
                )
            assert admitted.status_code == 201, admitted.text
        log = refused_start(primary.url, tmp_path / "all", IRREV_WAIT_AOF="all", **waits)
    said = "0 of 1 replicas fsynced the probe write in 3000 ms: the replicas did not fsync"
    assert said in log and "(is their appendonly on?)" in log, log


def turn_aof(replica: EmbeddedRedis, on: bool) -> None:
    """CONFIG SET appendonly on the replica; turned on, once its AOF is written (a
    replica reports fsyncs of its AOF only after that rewrite)."""
    with redis.Redis.from_url(replica.url, decode_responses=True) as client:
        client.config_set("appendonly", "yes" if on else "no")
        deadline = time.monotonic() + 30
        while on:
            found = client.info("persistence")
            if found["aof_enabled"] and not (
                found["aof_rewrite_in_progress"] or found["aof_rewrite_scheduled"]
            ):
                return
            assert time.monotonic() < deadline, "the replica's AOF was never written"
            time.sleep(0.05)


async def test_a_replica_whose_aof_is_turned_off_releases_admissions(
    replicated_valkey: ReplicatedRedis,
    suppliers: Server,
    upstream: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """IRREV_WAIT_AOF=all started on a replica that fsyncs; then its AOF is turned off
    (CONFIG SET appendonly no): it still receives every write, so WAIT would pass,
    but WAITAOF 1 1 counts no replica: 503 not_replicated, released, nothing sent
    (tests/gateway/test_replicas.py's checks), and admitted again once it is back on."""
    settings = {
        "IRREV_WAIT_AOF": "all",
        "IRREV_WAIT_REPLICAS": "1",
        "IRREV_WAIT_TIMEOUT_MS": "2500",
    }
    replica = replicated_valkey.replica
    with own_gateway(replicated_valkey.primary.url, suppliers, tmp_path, 1, **settings) as gateway:
        await unreplicated_admissions(
            gateway, upstream, lambda: turn_aof(replica, False), lambda: turn_aof(replica, True)
        )


async def test_a_post_whose_fsync_comes_back_short_is_counted_and_refused_until_repeated(
    suppliers: Server, tmp_path: Path
) -> None:
    """A post is kept even when its wait comes back short (the effect happened), so
    it is counted (irrev_unacknowledged_writes_total) and logged, and its caller is
    answered 503 not_fsynced: admitted with the primary's fsyncs on, posted after
    appendfsync is turned to no; the same post repeated once it is back: 200."""
    settings = {"IRREV_WAIT_AOF": "local", "IRREV_WAIT_TIMEOUT_MS": "300"}
    with (
        EmbeddedRedis(tmp_path / "valkey", binary=valkey_binary(), tcp=True) as server,
        own_gateway(server.url, suppliers, tmp_path, 1, **settings) as gateway,
    ):
        tenant = gateway.tenant("own")
        async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
            series = 'irrev_unacknowledged_writes_total{op="post"}'
            before = (await http.get("/metrics", headers=gateway.admin)).text
            assert series not in before
            hold, _ = await deploy_hold(http, tenant, "d1")
            with redis.Redis.from_url(server.url) as admin:
                admin.config_set("appendfsync", "no")
                posted = await http.post(
                    f"/v1/holds/{hold}/post", json={}, headers=tenant.auth("deployer-01")
                )
                admin.config_set("appendfsync", "always")
            assert_problem(posted, 503, "not_fsynced")
            seen = await http.get(f"/v1/holds/{hold}", headers=tenant.auth("deployer-01"))
            assert seen.json()["state"] == "posted"  # on the primary: nothing is undone
            again = await http.post(
                f"/v1/holds/{hold}/post", json={}, headers=tenant.auth("deployer-01")
            )
            assert again.status_code == 200, again.text
            after = (await http.get("/metrics", headers=gateway.admin)).text
        log = gateway.server.log(20_000)
    assert f"{series} 1.0" in after, after
    assert "write acknowledged without its wait" in log, log
