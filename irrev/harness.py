"""The one process harness: a loopback port, a server process (start, wait until it
answers, its log, stop), and generated tenant policies. `irrev demo`, `irrev bench`,
`irrev load`, the fault matrix and the tests all start their processes and write their
policies through it.

Every server binds 127.0.0.1 and starts in its own session, so a signal meant for one
(a fault's SIGKILL) never reaches another or this process, and a signal meant for it
reaches every process it started (a command prefix such as faketime passes none on);
every wait has a deadline. Servers this process started and did not stop are stopped
when it exits, and when it is sent SIGTERM (a CI timeout, an operator's `kill`):
their own sessions keep such a signal from reaching them.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml

from irrev.cli import CliError
from ledger import free_port
from pricing import format_token, hash_token

__all__ = [
    "PolicyDraft",
    "ProcessError",
    "Server",
    "answers",
    "at_exit",
    "forget",
    "free_port",
    "group_members",
    "new_token",
    "running",
    "uvicorn_command",
]

START_TIMEOUT_S = 60.0
# `irrev serve` gives in-flight forwards the upstream timeout plus a margin before it
# kills a stuck worker (gateway/serve.py); a server still alive after this is killed.
STOP_TIMEOUT_S = 15.0


class ProcessError(CliError, RuntimeError):
    """A server did not start or answer in time; the message ends with its log. A
    CliError: a command that starts servers (`irrev demo`, `load`, `bench`) exits 2
    with it, not a traceback, below the line `irrev serve` refused with when a
    gateway's output is not sent to a log."""


def uvicorn_command(app: str, port: int, *extra: str) -> list[str]:
    """uvicorn serving the factory `app` (module:function) on 127.0.0.1:`port`."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        *extra,
    ]


@dataclass(kw_only=True)
class Server:
    """A server process on a loopback port, its output appended to `log_path` (None:
    stdout is dropped and stderr is this process's, for a command a person watches)."""

    name: str
    argv: list[str]
    env: dict[str, str] | None
    log_path: Path | None
    port: int = field(default_factory=free_port)
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    # Any loopback address (Linux routes all of 127/8 to lo): several "hosts" on one
    # machine.
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ProcessError(f"{self.name} was never started")
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, ready_path: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start it and wait until GET `ready_path` answers 200; a server that exits or
        does not answer in time is killed and a ProcessError raised. A port that
        already answers is refused before anything starts: the readiness seen there
        would be the other process's (an orphan of an earlier run, say)."""
        if self.alive:
            raise ProcessError(f"{self.name} is already running")
        if answers(self.host, self.port):
            raise ProcessError(
                f"something already listens on {self.host}:{self.port}, where {self.name} "
                "was to start: stop it or choose another port"
            )
        with open(self.log_path or os.devnull, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if self.log_path else None,
                start_new_session=True,
            )
        _started(self)
        try:
            self.wait_ready(ready_path, timeout_s)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, path: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    code = self.process.returncode if self.process else None
                    raise ProcessError(f"{self.name} exited ({code}) at start-up{self._tail()}")
                try:
                    if client.get(path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise ProcessError(f"{self.name} did not answer {path} in {timeout_s:g} s{self._tail()}")

    def log(self, size: int = 4000) -> str:
        """The end of its log ("" without one)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _tail(self) -> str:
        log = self.log()
        return f":\n{log}" if log else ""

    def kill(self) -> None:
        """SIGKILL to its whole process group, as a crash of everything it started;
        waits until the group is gone."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)
        self._wait_group_gone(time.monotonic() + STOP_TIMEOUT_S)
        _LIVE.pop(self.process.pid, None)

    def wait_dead(self, timeout_s: float) -> bool:
        """Whether the process exited (a crash point, say) within `timeout_s`."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM to its whole process group (uvicorn's supervisor and its workers
        each shut down; the child of a command prefix gets it too, which the prefix
        would not pass on), then SIGKILL to whatever of the group is left after
        STOP_TIMEOUT_S, also when the process itself has exited (its children
        outlive it otherwise, on its port). Waits until the group is gone."""
        if self.process is None:
            return
        deadline = time.monotonic() + STOP_TIMEOUT_S
        self._signal_group(signal.SIGTERM)
        if not self._wait_group_gone(deadline):
            self._signal_group(signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)
        _LIVE.pop(self.process.pid, None)
        if not self._wait_group_gone(time.monotonic() + STOP_TIMEOUT_S):
            raise ProcessError(
                f"{self.name}: processes {group_members(self.process.pid)} of its group "
                "outlived SIGKILL"
            )

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        # Its pid is its group's id (start_new_session); the group outlives it while
        # any member does, so the id is not reused meanwhile. None left: nothing to do.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def _wait_group_gone(self, deadline: float) -> bool:
        """Whether every process of its group exited by `deadline` (the server itself
        reaped on the way)."""
        assert self.process is not None
        while True:
            self.process.poll()
            if not group_members(self.process.pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


# The servers this process started and has not stopped, by process group; then what
# else must not outlive it (a bench's redis-server and work directory), by handle.
_LIVE: dict[int, Server] = {}
_CLEANUPS: dict[int, Callable[[], None]] = {}
_handles = itertools.count()


def at_exit(cleanup: Callable[[], None]) -> int:
    """Run `cleanup` (after the servers are stopped) if the process exits, or is sent
    SIGTERM, before `forget` is called with the handle returned."""
    handle = next(_handles)
    _CLEANUPS[handle] = cleanup
    return handle


def forget(handle: int) -> None:
    _CLEANUPS.pop(handle, None)


def _started(server: Server) -> None:
    _LIVE[server.pid] = server
    _watch_sigterm()


def _watch_sigterm() -> None:
    """SIGTERM handled by _terminated, set from the main thread (the only one that may
    set a handler: commands start their servers from worker threads too, which is why
    it is also set on import); a handler someone else set (uvicorn, a test runner) is
    theirs to keep."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def stop_leftovers(grace_s: float = 5.0) -> None:
    """SIGTERM to every group this process started and has not stopped, all at once,
    then SIGKILL to what is left of them after `grace_s`; then the cleanups `at_exit`
    was given and not told to forget, in the order given."""
    # A copy first: a worker thread may start or stop a server meanwhile.
    servers = [s for s in list(_LIVE.values()) if group_members(s.pid)]
    for server in servers:
        server._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for server in servers:
        if not server._wait_group_gone(deadline):
            server._signal_group(signal.SIGKILL)
            server._wait_group_gone(time.monotonic() + grace_s)
    _LIVE.clear()
    while _CLEANUPS:
        cleanup = _CLEANUPS.pop(min(_CLEANUPS))
        with contextlib.suppress(Exception):
            cleanup()


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: its servers stopped (a second SIGTERM meanwhile ignored, not run again
    over the first), then the process ends as SIGTERM ends it (not by an exception,
    which a task's cleanup could catch and carry on after), whatever the cleanup
    raised."""
    signal.signal(signum, signal.SIG_IGN)
    try:
        stop_leftovers()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _forked() -> None:
    """In a forked child: its parent's servers and cleanups are the parent's, which a
    child's exit or SIGTERM must not stop."""
    _LIVE.clear()
    _CLEANUPS.clear()


atexit.register(stop_leftovers)
os.register_at_fork(after_in_child=_forked)
_watch_sigterm()


def group_members(group: int) -> list[int]:
    """The live processes of process group `group` (Linux's /proc). Zombies do not
    count: an orphan's exit is reaped by PID 1, which in a container may never do it."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # After the command name, which may hold spaces and parentheses: state, ppid, pgrp.
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == group and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def answers(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on `host`:`port`."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass
class PolicyDraft:
    """A generated tenant policy: the document, and the plaintext secrets whose hashes
    it holds (agents' bearer tokens, tool APIs' settler tokens). Built as data and
    written with yaml.safe_dump, never by editing YAML text."""

    document: dict[str, Any]
    tokens: dict[str, str] = field(default_factory=dict)
    settlers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> PolicyDraft:
        """A policy file (an example, say) as the start of a new one."""
        return cls(yaml.safe_load(path.read_text(encoding="utf-8")))

    @classmethod
    def parse(cls, text: str) -> PolicyDraft:
        return cls(yaml.safe_load(text))

    def copy(self) -> PolicyDraft:
        return copy.deepcopy(self)

    @property
    def tenant(self) -> str:
        return str(self.document["tenant"])

    def named(self, tenant: str) -> PolicyDraft:
        self.document["tenant"] = tenant
        return self

    def point(self, upstream: str, tools: tuple[str, ...] | None = None) -> PolicyDraft:
        """Send these tools (all that have an upstream if None) to `upstream`."""
        for name, tool in self.document["tools"].items():
            if (name in tools) if tools is not None else "upstream" in tool:
                tool["upstream"] = upstream
        return self

    def fresh_tokens(self) -> PolicyDraft:
        """A new bearer token for every agent (their hashes in the document)."""
        for name, agent in self.document["agents"].items():
            self.tokens[name] = new_token()
            agent["token_sha256"] = hash_token(self.tokens[name])
        return self

    def add_agent(self, name: str, **fields: Any) -> str:
        """An agent with a new token; returns the token."""
        self.tokens[name] = new_token()
        agents = self.document.setdefault("agents", {})
        agents[name] = {**fields, "token_sha256": hash_token(self.tokens[name])}
        return self.tokens[name]

    def fresh_settlers(self) -> PolicyDraft:
        """A new settler token for every tool (the tool API's own credential)."""
        for name, tool in self.document["tools"].items():
            self.settlers[name] = new_token()
            tool["settler_token_sha256"] = hash_token(self.settlers[name])
        return self

    def text(self) -> str:
        return yaml.safe_dump(self.document, sort_keys=False)

    def write(self, directory: Path, name: str | None = None) -> Path:
        """`directory`/<tenant>.yaml (or `name`), replaced atomically: a gateway that
        reloads meanwhile reads the old file or the new one, never half of one."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / (name or f"{self.tenant}.yaml")
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(self.text(), encoding="utf-8")
        temporary.replace(path)
        return path


def new_token() -> str:
    return format_token(secrets.token_bytes(32))


@contextmanager
def running(server: Server, ready_path: str) -> Iterator[Server]:
    """`server`, started and answering `ready_path`, until the block ends."""
    try:
        server.start(ready_path)
        yield server
    finally:
        server.stop()
