"""The processes a fault run uses besides its redis-server (`EmbeddedRedis`): gateway
workers (uvicorn, one process each) and the supplier upstream, as harness Servers:
each in its own session, so a signal meant for one never reaches another, and
stopped in a `finally` (SIGKILL if it does not exit)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from irrev.harness import ProcessError, Server, free_port, uvicorn_command


@dataclass
class SupplierProc:
    server: Server
    reset_port: int

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def reset_url(self) -> str:
        return f"http://127.0.0.1:{self.reset_port}"


def start_supplier(workdir: Path) -> SupplierProc:
    server = Server(
        name="supplier", argv=[], env=dict(os.environ), log_path=workdir / "supplier.log"
    )
    reset_port = free_port()
    server.argv = [sys.executable, "-m", "irrev.upstreams.supplier", "--port", str(server.port)]
    server.argv += ["--reset-port", str(reset_port)]
    server.start("/_stats")
    return SupplierProc(server, reset_port)


@dataclass
class GatewayProc:
    """One gateway worker process on its own port; restartable on the same port."""

    index: int
    port: int
    env: dict[str, str]
    workdir: Path
    crash_at: str = ""
    server: Server | None = None
    starts: int = field(default=0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.server is not None and self.server.alive

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
        command = uvicorn_command("gateway.app:app_from_env", self.port)
        log = self.workdir / f"gateway-{self.index}.log"
        self.server = Server(
            name=f"gateway {self.index}", argv=command, env=env, log_path=log, port=self.port
        )
        self.starts += 1
        self.server.start("/healthz")

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()

    def wait_dead(self, timeout_s: float) -> bool:
        """Whether the worker died (e.g. at its crash point) within `timeout_s`."""
        return self.server is None or self.server.wait_dead(timeout_s)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
