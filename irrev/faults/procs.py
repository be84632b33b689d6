"""The real processes a fault run uses: gateway workers (uvicorn, one process each),
the supplier upstream, and a redis-server (`EmbeddedRedis`). Every process is
started in its own session, so a signal meant for one never reaches another, and
is stopped by pid in a `finally` (SIGKILL if it does not exit)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class ProcessError(RuntimeError):
    """A process of the bench did not start or answer in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Proc:
    """One child process, its log file and how to end it."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash; waits until the process is gone."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time."""
        if not self.alive:
            self.popen.wait()
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, size: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-size:].decode(errors="replace")
        except FileNotFoundError:
            return ""


def spawn(name: str, args: list[str], log: Path, env: dict[str, str]) -> Proc:
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Proc(name, popen, log)


def wait_http(proc: Proc, url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll `url` until it answers 200; fail fast if the process died."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if not proc.alive:
                raise ProcessError(f"{proc.name} exited at start-up:\n{proc.log_tail()}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise ProcessError(f"{proc.name} did not answer {url} in {timeout_s:g} s:\n{proc.log_tail()}")


@dataclass
class SupplierProc:
    proc: Proc
    port: int
    reset_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def reset_url(self) -> str:
        return f"http://127.0.0.1:{self.reset_port}"


def start_supplier(workdir: Path) -> SupplierProc:
    port, reset_port = free_port(), free_port()
    args = [sys.executable, "-m", "irrev.upstreams.supplier", "--port", str(port)]
    args += ["--reset-port", str(reset_port)]
    proc = spawn("supplier", args, workdir / "supplier.log", dict(os.environ))
    supplier = SupplierProc(proc, port, reset_port)
    try:
        wait_http(proc, f"{supplier.url}/_stats")
    except BaseException:
        proc.kill()
        raise
    return supplier


@dataclass
class GatewayProc:
    """One gateway worker process on its own port; restartable on the same port."""

    index: int
    port: int
    env: dict[str, str]
    workdir: Path
    crash_at: str = ""
    proc: Proc | None = None
    starts: int = field(default=0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive

    def start(self, crash_at: str = "") -> None:
        """Start (again) on the same port; `crash_at` arms a crash point (crashpoints.py)."""
        if self.alive:
            raise ProcessError(f"gateway {self.index} is already running")
        self.crash_at = crash_at
        env = {**self.env, "IRREV_PORT": str(self.port)}
        if crash_at:
            env["IRREV_CRASH_AT"] = crash_at
        else:
            env.pop("IRREV_CRASH_AT", None)
        args = [sys.executable, "-m", "uvicorn", "gateway.app:app_from_env", "--factory"]
        args += ["--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--log-level", "warning", "--no-access-log"]
        log = self.workdir / f"gateway-{self.index}.log"
        self.proc = spawn(f"gateway {self.index}", args, log, env)
        self.starts += 1
        try:
            wait_http(self.proc, f"{self.url}/healthz")
        except BaseException:
            self.proc.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def wait_dead(self, timeout_s: float) -> bool:
        """Whether the worker died (e.g. at its crash point) within `timeout_s`."""
        if self.proc is None:
            return True
        try:
            self.proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
