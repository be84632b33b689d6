"""Every Redis error reaches callers as LedgerUnavailable naming its cause and what
to do, against real servers: a stopped one, a replica, a wrong-type key, a flushed
script cache, a user without permissions, a full memory, a busy pool, a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis import exceptions as redis_errors

from ledger.audit import audit_tenant
from ledger.checkpoint import trim
from ledger.client import Ledger
from ledger.cluster import cluster_enabled
from ledger.connect import connect
from ledger.embedded import EmbeddedRedis
from ledger.errors import (
    HoldNotFound,
    LedgerUnavailable,
    RedisFailure,
    redis_failure,
    translate_redis_errors,
)
from ledger.journal import read_journal
from ledger.keys import accounts_key, deadlines_key, journal_key
from ledger.ports import free_port
from ledger.records import AccountSpec, HoldState

from ..conftest import ReplicatedRedis, server_binary
from .conftest import open_accounts

# How long the pool-exhaustion test keeps its one connection blocked.
BLOCK_S = 30

HOUR_MS = 3_600_000
CLUSTER_START_S = 30.0


@pytest.fixture
async def own_ledger(redis_binary: Path, tmp_path: Path) -> AsyncIterator[Ledger]:
    """A ledger on a server of its own, for tests that change the server's config."""
    with EmbeddedRedis(tmp_path / "own", binary=redis_binary, tcp=True) as server:
        ledger = Ledger.from_url(server.url)
        try:
            yield ledger
        finally:
            await ledger.aclose()


async def test_a_server_that_never_ran_is_unreachable_and_says_where_to_look() -> None:
    port = free_port()
    ledger = Ledger.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        with pytest.raises(LedgerUnavailable) as raised:
            await ledger.reserve("t", "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    finally:
        await ledger.aclose()
    assert raised.value.cause is RedisFailure.UNREACHABLE
    assert raised.value.operation == "reserve"
    assert isinstance(raised.value.__cause__, redis_errors.ConnectionError)
    message = str(raised.value)
    assert message.startswith("cannot reach Redis during reserve (")
    # redis-py's own words keep the cause: errno 111 is ECONNREFUSED.
    assert f"Error 111 connecting to 127.0.0.1:{port}" in message
    assert "IRREV_REDIS_URL" in message


async def test_a_server_stopped_under_a_pooled_connection_is_unreachable(
    redis_server: EmbeddedRedis, tenant: str
) -> None:
    ledger = Ledger.from_url(redis_server.url)
    try:
        await open_accounts(ledger, tenant, tenant_acme=100)
        await asyncio.to_thread(redis_server.kill)
        for call in (
            ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS),
            ledger.balance(tenant, "tenant:acme"),
            ledger.hold_ids(tenant, HoldState.POSTED),
            audit_tenant(ledger, tenant),
            read_journal(ledger, tenant),
        ):
            with pytest.raises(LedgerUnavailable) as raised:
                await call
            assert raised.value.cause is RedisFailure.UNREACHABLE, raised.value
    finally:
        await ledger.aclose()


async def test_a_wrong_type_key_is_named_as_such_in_scripts_and_reads(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=100)
    await ledger.redis.set(accounts_key(tenant), "not the accounts hash")
    # Inside a script Redis 6 wraps the code ("ERR Error running script ...:
    # WRONGTYPE ..."), Redis 7 puts it first; a plain read gets it bare.
    for call in (
        ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS),
        ledger.balance(tenant, "tenant:acme"),
    ):
        with pytest.raises(LedgerUnavailable) as raised:
            await call
        assert raised.value.cause is RedisFailure.WRONG_TYPE, raised.value
        assert "WRONGTYPE" in str(raised.value) and "irrev ledger audit" in str(raised.value)


async def test_journal_trim_and_audit_translate_too(
    ledger: Ledger, tenant: str, tmp_path: Path
) -> None:
    """The journal, the trimmer and the audit's own index reads (the audit had no
    translation before) raise the typed error, not redis-py's."""
    await ledger.redis.set(journal_key(tenant), "not a stream")
    with pytest.raises(LedgerUnavailable) as raised:
        await read_journal(ledger, tenant)
    assert raised.value.cause is RedisFailure.WRONG_TYPE
    with pytest.raises(LedgerUnavailable) as raised:
        await trim(ledger, tenant, tmp_path, 2**52)
    assert raised.value.cause is RedisFailure.WRONG_TYPE

    other = f"{tenant}-b"
    await ledger.redis.set(deadlines_key(other), "not a sorted set")
    with pytest.raises(LedgerUnavailable) as raised:
        await audit_tenant(ledger, other)
    assert (raised.value.operation, raised.value.cause) == ("audit", RedisFailure.WRONG_TYPE)


async def test_a_flushed_script_cache_is_no_script(ledger: Ledger) -> None:
    """The ledger reloads a forgotten script by itself (test_replicas); a bare
    EVALSHA after SCRIPT FLUSH shows what the translator makes of NOSCRIPT."""
    sha = await ledger.redis.script_load("return 1")
    await ledger.redis.script_flush()
    with pytest.raises(LedgerUnavailable) as raised, translate_redis_errors("evalsha"):
        await ledger.redis.evalsha(sha, 0)
    assert raised.value.cause is RedisFailure.NO_SCRIPT
    assert "SCRIPT FLUSH" in str(raised.value)


async def test_a_replica_refuses_writes_and_says_to_use_the_primary(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    ledger = Ledger.from_url(replicated_redis.replica.url)
    try:
        with pytest.raises(LedgerUnavailable) as raised:
            await ledger.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=100, soft_limit=100)
            )
    finally:
        await ledger.aclose()
    assert raised.value.cause is RedisFailure.READ_ONLY
    assert "read-only replica" in str(raised.value) and "primary" in str(raised.value)


@pytest.fixture
def acl_user(redis_url: str) -> Iterator[tuple[str, str]]:
    """A Redis user that may only read, and its password; removed afterwards."""
    if cluster_enabled(redis_url):
        # ACL users are per node, and a cluster client needs CLUSTER SLOTS besides.
        pytest.skip("a user made on one node of a cluster is unknown to the others")
    name, password = f"irrev-test-{uuid.uuid4().hex}", uuid.uuid4().hex
    with redis.Redis.from_url(redis_url) as admin:
        admin.acl_setuser(
            name, enabled=True, passwords=[f"+{password}"], commands=["+@read"], keys=["*"]
        )
        try:
            yield name, password
        finally:
            admin.acl_deluser(name)


async def test_wrong_credentials_and_missing_permissions_are_told_apart(
    redis_url: str, acl_user: tuple[str, str], tenant: str
) -> None:
    name, password = acl_user
    wrong = Ledger.from_url(redis_url, username=name, password="wrong")
    reader = Ledger.from_url(redis_url, username=name, password=password)
    try:
        with pytest.raises(LedgerUnavailable) as raised:
            await wrong.ping()
        assert raised.value.cause is RedisFailure.AUTHENTICATION
        assert "password" in str(raised.value)
        assert await reader.balance(tenant, "tenant:acme") is None
        with pytest.raises(LedgerUnavailable) as raised:
            await reader.upsert_account(
                tenant, AccountSpec(account="tenant:acme", limit=100, soft_limit=100)
            )
        assert raised.value.cause is RedisFailure.NO_PERMISSION
        assert "ACL" in str(raised.value)
    finally:
        await wrong.aclose()
        await reader.aclose()


async def test_a_full_memory_is_out_of_memory(own_ledger: Ledger, tenant: str) -> None:
    await own_ledger.redis.config_set("maxmemory", "1")
    with pytest.raises(LedgerUnavailable) as raised:
        await own_ledger.upsert_account(
            tenant, AccountSpec(account="tenant:acme", limit=100, soft_limit=100)
        )
    assert raised.value.cause is RedisFailure.OUT_OF_MEMORY
    assert "maxmemory" in str(raised.value)


async def test_a_pool_with_every_connection_busy_is_not_called_unreachable(
    redis_url: str, tenant: str
) -> None:
    # The BLPOP below blocks for 30 s: a socket timeout under that (the cluster
    # client's default is 5 s) ended it early on a loaded machine, and the client's
    # reaction to that timeout (a new topology, its old nodes left unclosed) failed
    # whichever test the garbage collector then ran in.
    ledger = Ledger.from_url(
        redis_url, max_connections=1, pool_timeout_s=0.05, socket_timeout=BLOCK_S * 2
    )
    try:
        # In the tenant's slot: on a cluster, its node's only connection is taken.
        never = f"irrev:{{{tenant}}}:never"

        async def block() -> None:
            await ledger.redis.blpop([never], timeout=BLOCK_S)

        blocked = asyncio.create_task(block())
        # On a loaded machine a cluster client's first call (slots discovery) can
        # take longer than any fixed sleep: wait until the server holds the BLPOP.
        await _until_a_client_blocks_in("blpop", redis_url)
        with pytest.raises(LedgerUnavailable) as raised:
            await ledger.balance(tenant, "tenant:acme")
        assert raised.value.cause is RedisFailure.POOL_EXHAUSTED
        assert "max_connections" in str(raised.value)
        assert not blocked.done()
        blocked.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocked
    finally:
        await ledger.aclose()


async def _until_a_client_blocks_in(command: str, redis_url: str) -> None:
    probe = connect(redis_url)
    try:
        deadline = time.monotonic() + 20
        while True:
            if isinstance(probe, redis.asyncio.RedisCluster):
                per_node = await probe.client_list(
                    target_nodes=redis.asyncio.RedisCluster.ALL_NODES
                )
                # redis-py types the reply as one node's list; asked for every node, the
                # cluster client answers a dict of them by node.
                clients = [c for node in per_node.values() for c in node]  # type: ignore[attr-defined]
            else:
                clients = await probe.client_list()
            if any(c.get("cmd") == command for c in clients):
                return
            assert time.monotonic() < deadline, f"no client ever blocked in {command}"
            await asyncio.sleep(0.05)
    finally:
        await probe.aclose()


async def test_the_ledgers_own_errors_pass_through(ledger: Ledger, tenant: str) -> None:
    with pytest.raises(HoldNotFound), translate_redis_errors("void"):
        await ledger.void(tenant, "nope")


def _no_orphan() -> None:
    """Run in the child: SIGKILL it when the test process dies, however it dies."""
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait(client: redis.Redis, state: str) -> None:
    """Until the node answers with `cluster_state` `state` ('' for any)."""
    deadline = time.monotonic() + CLUSTER_START_S
    while True:
        try:
            info = client.cluster("INFO")
            if state in ("", info["cluster_state"]):
                return
        except redis_errors.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"the cluster node never reached {state!r}"
        time.sleep(0.05)


@pytest.fixture
def cluster_pair(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two Redis Cluster nodes (Redis 7) splitting the slots between them, up and
    agreeing; yields their URLs."""
    binary = server_binary("redis7")
    nodes: list[tuple[int, int, subprocess.Popen[bytes]]] = []
    try:
        for index in range(2):
            port, bus = free_port(), free_port()
            directory = tmp_path / f"node{index}"
            directory.mkdir()
            argv = [str(binary), "--port", str(port), "--cluster-enabled", "yes"]
            argv += ["--cluster-port", str(bus), "--dir", str(directory), "--save", ""]
            argv += ["--appendonly", "no", "--bind", "127.0.0.1"]
            process = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_no_orphan
            )
            nodes.append((port, bus, process))
        clients = [redis.Redis(port=port, decode_responses=True) for port, _, _ in nodes]
        for client in clients:
            _wait(client, "")
        clients[0].execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
        clients[1].execute_command("CLUSTER", "ADDSLOTSRANGE", 8192, 16383)
        clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[1][0], nodes[1][1])
        for client in clients:
            _wait(client, "ok")
            client.close()
        yield f"redis://127.0.0.1:{nodes[0][0]}/0", f"redis://127.0.0.1:{nodes[1][0]}/0"
    finally:
        for _, _, process in nodes:
            process.terminate()
        for _, _, process in nodes:
            process.wait(timeout=30)


async def test_a_cluster_node_redirects_and_the_message_keeps_moved(
    cluster_pair: tuple[str, str],
) -> None:
    first, _ = cluster_pair
    # A standalone client (Ledger.from_url would see the cluster and use a cluster one).
    ledger = Ledger(redis.asyncio.Redis.from_url(first, decode_responses=True))
    try:
        with redis.Redis.from_url(first) as client:
            elsewhere = next(
                t for t in (f"t{i}" for i in range(1000)) if client.cluster("KEYSLOT", t) >= 8192
            )
        with pytest.raises(LedgerUnavailable) as raised:
            await ledger.balance(elsewhere, "tenant:acme")
        assert raised.value.cause is RedisFailure.CLUSTER_REDIRECT
        assert "MOVED" in str(raised.value) and "cluster client" in str(raised.value)
        with pytest.raises(LedgerUnavailable) as raised:
            await ledger.outcomes([elsewhere])
        assert raised.value.cause is RedisFailure.CLUSTER_REDIRECT
    finally:
        await ledger.aclose()


async def test_a_call_the_cluster_client_refuses_to_send_is_a_bug_not_a_cluster_down(
    cluster_pair: tuple[str, str],
) -> None:
    # The cluster serves: a call redis-py's cluster client will not pipeline (TIME has
    # no key) must not send an operator to look for a failed node.
    client = connect(cluster_pair[0])
    try:
        with pytest.raises(LedgerUnavailable) as raised, translate_redis_errors("snapshot"):
            async with client.pipeline(transaction=False) as pipe:
                pipe.time()
                await pipe.execute()
        assert raised.value.cause is RedisFailure.CLUSTER_CLIENT
        assert "ledger bug" in str(raised.value)
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (redis_errors.ResponseError("WRONGTYPE Operation against a key"), RedisFailure.WRONG_TYPE),
        (
            redis_errors.ResponseError(
                "Error running script (call to f_0): @user_script:9: WRONGTYPE Operation"
            ),
            RedisFailure.WRONG_TYPE,
        ),
        (redis_errors.ResponseError("BUSY Redis is busy running a script"), RedisFailure.BUSY),
        (redis_errors.ResponseError("CROSSSLOT Keys don't hash"), RedisFailure.CROSS_SLOT),
        (redis_errors.MovedError("3999 127.0.0.1:6381"), RedisFailure.CLUSTER_REDIRECT),
        (redis_errors.AskError("3999 127.0.0.1:6381"), RedisFailure.CLUSTER_REDIRECT),
        (redis_errors.ClusterDownError("Hash slot not served"), RedisFailure.CLUSTER_DOWN),
        (redis_errors.TryAgainError("Multiple keys request"), RedisFailure.MIGRATING),
        (redis_errors.BusyLoadingError("Redis is loading"), RedisFailure.LOADING),
        (
            redis_errors.RedisClusterException(
                "Redis Cluster cannot be connected. Please provide at least one reachable node"
            ),
            RedisFailure.UNREACHABLE,
        ),
        (
            redis_errors.RedisClusterException("All slots are not covered after query all"),
            RedisFailure.CLUSTER_DOWN,
        ),
        (redis_errors.SlotNotCoveredError("Slot 7 is not covered"), RedisFailure.CLUSTER_DOWN),
        (redis_errors.TimeoutError("Timeout reading from socket"), RedisFailure.TIMEOUT),
        (redis_errors.DataError("Invalid input of type: 'dict'"), RedisFailure.ENCODING),
        (redis_errors.ResponseError("ERR unknown command 'FOO'"), RedisFailure.REFUSED),
        (redis_errors.ResponseError("ERR this mentions BUSY mid-sentence"), RedisFailure.REFUSED),
    ],
)
def test_causes_of_errors_no_local_server_produces(
    error: redis_errors.RedisError, cause: RedisFailure
) -> None:
    assert redis_failure(error) is cause


def test_every_cause_has_a_message_with_advice() -> None:
    for cause in RedisFailure:
        message = str(LedgerUnavailable("reserve", cause, "detail"))
        what, _, advice = message.partition(" during reserve (detail): ")
        assert what and advice, cause
    assert str(LedgerUnavailable("ping", RedisFailure.BUSY)) == (
        "Redis is busy running a long script during ping: retry in a moment"
    )
