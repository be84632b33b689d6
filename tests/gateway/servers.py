"""Real processes for the gateway tests: the supplier upstream, `irrev serve` with
several workers, and the tenant policies they serve (copies of the examples with a
fresh tenant id, fresh agent tokens and the test's own upstream).

Everything binds to 127.0.0.1; every wait polls with a deadline.
"""

from __future__ import annotations

import copy
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from pricing.credentials import format_token, hash_token

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
START_DEADLINE_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """A server process on a loopback port, its output in a log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_path: str) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready(ready_path)

    def wait_ready(self, path: str) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        with httpx.Client(base_url=self.url, timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited early:\n{self.log()}")
                try:
                    if client.get(path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {START_DEADLINE_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM (uvicorn's supervisor stops its workers), then SIGKILL the group."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRREV_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def start_suppliers(log_dir: Path) -> Server:
    server = Server(
        "suppliers",
        [str(BIN / "python"), "-m", "uvicorn", "tests.gateway.suppliers:app"],
        base_env(),
        log_dir / "suppliers.log",
    )
    server.argv += ["--host", "127.0.0.1", "--port", str(server.port), "--log-level", "warning"]
    server.start("/ready/catalog")
    return server


@dataclass(frozen=True)
class Tenant:
    """A tenant the gateway serves: its id, its agents' tokens, its supplier's URL."""

    id: str
    tokens: Mapping[str, str]
    supplier: str
    settlers: Mapping[str, str] = field(default_factory=dict)

    def auth(self, agent: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[agent]}"}

    def settler(self, tool: str) -> dict[str, str]:
        """The credential of the tool API itself, which settles its holds."""
        return {"Authorization": f"Bearer {self.settlers[tool]}"}


def write_policy(
    directory: Path,
    example: str,
    tenant: str,
    supplier_url: str,
    **overrides: Any,
) -> Tenant:
    """A copy of examples/<example>.yaml as `tenant`, with fresh tokens; its tools point
    at `supplier_url` and top-level keys are replaced by `overrides`."""
    data = copy.deepcopy(yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text()))
    data["tenant"] = tenant
    tokens = {}
    for agent_id, agent in data["agents"].items():
        tokens[agent_id] = format_token(secrets.token_bytes(32))
        agent["token_sha256"] = hash_token(tokens[agent_id])
    settlers = {}
    for name, tool in data["tools"].items():
        if "upstream" in tool:
            tool["upstream"] = supplier_url
        settlers[name] = format_token(secrets.token_bytes(32))
        tool["settler_token_sha256"] = hash_token(settlers[name])
    data.update(overrides)
    (directory / f"{tenant}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return Tenant(tenant, tokens, supplier_url, settlers)
