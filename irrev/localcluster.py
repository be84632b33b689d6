"""A local Redis Cluster for the tests and the fault matrix: 3 primaries with 1 replica
each (or `replicas` each), each a real redis-server on loopback, created by
`redis-cli --cluster create`.

The servers run in the foreground as our children and are told by the kernel to
die with us (PR_SET_PDEATHSIG), so a killed test run leaves no cluster behind.
Each node gets its own data and cluster-bus ports from a free-port finder (Redis 7's
`cluster-port`), so no port + 10000 convention can collide with anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ledger import free_ports

PRIMARIES = 3
NODE_TIMEOUT_MS = 2000
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ClusterNode:
    port: int
    bus_port: int
    data_dir: Path
    binary: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                str(self.binary),
                *["--port", str(self.port), "--bind", "127.0.0.1"],
                *["--cluster-enabled", "yes", "--cluster-port", str(self.bus_port)],
                *["--cluster-config-file", "nodes.conf"],
                *["--cluster-node-timeout", str(NODE_TIMEOUT_MS)],
                *["--dir", str(self.data_dir), "--logfile", "redis.log"],
                *["--save", "", "--appendonly", "no"],
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 30
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited; see {self.data_dir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} never answered")
            time.sleep(0.02)

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """SIGKILL the node and wait for it (it keeps its nodes.conf for `start`)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    @contextlib.contextmanager
    def client(self) -> Iterator[redis.Redis]:
        client = redis.Redis(
            host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=5
        )
        try:
            yield client
        finally:
            client.close()


@dataclass
class LocalCluster:
    """The nodes (the first PRIMARIES are the primaries at creation) and helpers for
    tests that stop a replica or move a slot. `replicas` per primary: 2 lets a primary
    fail over and still have a replica to acknowledge WAIT 1."""

    binary: Path
    root: Path
    replicas: int = 1
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The URL of one node: a client is expected to find the rest."""
        return self.nodes[0].url

    def start(self) -> None:
        count = PRIMARIES * (1 + self.replicas)
        ports = free_ports(2 * count)
        self.nodes = [
            ClusterNode(ports[2 * i], ports[2 * i + 1], self.root / f"node{i}", self.binary)
            for i in range(count)
        ]
        for node in self.nodes:
            for attempt in range(3):  # another process may take a free port first
                try:
                    node.start()
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
                    node.port, node.bus_port = free_ports(2)
        subprocess.run(
            [
                str(self.binary.with_name("redis-cli")),
                "--cluster",
                "create",
                *(node.address for node in self.nodes),
                *["--cluster-replicas", str(self.replicas), "--cluster-yes"],
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def wait_healthy(self, deadline_s: float = 60.0) -> None:
        """Until every node says cluster_state:ok, agrees on the slots, and every
        replica's link to its primary is up and caught up, and every primary has its
        `replicas`."""
        deadline = time.monotonic() + deadline_s
        while not self._healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become healthy")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            epochs = set()
            for node in self.nodes:
                with node.client() as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    if "cluster_state:ok" not in info:
                        return False
                    if "cluster_slots_assigned:16384" not in info:
                        return False
                    epochs.add(_field(info, "cluster_current_epoch"))
                    replication = client.info("replication")
                    if replication["role"] == "slave" and (
                        replication.get("master_link_status") != "up"
                        or replication.get("master_sync_in_progress")
                    ):
                        return False
                    primary = replication["role"] == "master"
                    if primary and replication["connected_slaves"] < self.replicas:
                        return False
            return len(epochs) == 1
        except redis.RedisError:
            return False

    def primary_for(self, key: str) -> ClusterNode:
        """The node serving `key`'s slot now."""
        with self.nodes[0].client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return self._node(int(primary[1]))
        raise RuntimeError(f"no node serves the slot of {key}")

    def replicas_of(self, primary: ClusterNode) -> list[ClusterNode]:
        with primary.client() as client:
            replication = client.info("replication")
        ports = [
            int(replication[f"slave{i}"]["port"]) for i in range(replication["connected_slaves"])
        ]
        return [self._node(port) for port in ports]

    def migrate_slot(
        self, key: str, target: ClusterNode, *, per_batch: int = 1, pause_s: float = 0.0
    ) -> int:
        """Move the slot of `key` to `target` the way `redis-cli --cluster reshard`
        does (SETSLOT IMPORTING/MIGRATING, MIGRATE of its keys, SETSLOT NODE on every
        primary), `per_batch` keys at a time with `pause_s` between batches so that
        clients meet the slot mid-migration. Returns how many keys moved."""
        source = self.primary_for(key)
        if source is target:
            raise ValueError(f"{target.address} serves the slot of {key} already")
        source_id, target_id = self.node_id(source), self.node_id(target)
        moved = 0
        with source.client() as src, target.client() as dst:
            slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, per_batch):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause_s)
            for node in (target, source, *self.nodes):
                with node.client() as client:
                    if client.info("replication")["role"] == "master":
                        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    @contextlib.contextmanager
    def stuck_migration(self, key: str) -> Iterator[ClusterNode]:
        """The slot of `key` marked as moving to another primary (SETSLOT MIGRATING and
        IMPORTING) with no key moved, as a reshard tool that died mid-move leaves it,
        for as long as the block runs; then stable on its primary again. Yields the
        target."""
        source = self.primary_for(key)
        target = next(n for n in self.nodes if n is not source and _is_primary(n))
        with source.client() as src, target.client() as dst:
            slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
            try:
                yield target
            finally:
                src.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
                dst.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")

    def node_id(self, node: ClusterNode) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID"))

    def _node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)


def _is_primary(node: ClusterNode) -> bool:
    with node.client() as client:
        return bool(client.info("replication")["role"] == "master")


def _field(info: str, name: str) -> str:
    for line in info.splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    return ""
