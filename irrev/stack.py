"""A whole irrev stack on this machine, in real processes: a supplier API, gateway
workers and (from the caller) a Redis. Used by `irrev demo`, `irrev bench gateway`
and `irrev load`; everything listens on 127.0.0.1 only and is stopped on exit."""

from __future__ import annotations

import csv
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import httpx

from irrev.cli import CliError

EXAMPLES = Path("examples")
DEMO_ADMIN_TOKEN = "demo-admin-token-not-secret"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# What the demo and load runs serve: the procurement tenant and its demo tokens. Only
# these: another example may need a secret (payments-api.yaml reads its API key from
# the environment), and one tenant that cannot load refuses the whole directory.
STACK_POLICIES = ("procurement.yaml", "procurement.tokens.yaml")


def render_policies(directory: Path, supplier_url: str, examples: Path = EXAMPLES) -> Path:
    """Copy the procurement example and its demo tokens into `directory`, pointing the
    supplier tool at `supplier_url`."""
    if not (examples / "procurement.yaml").is_file():
        raise CliError(
            f"no {examples / 'procurement.yaml'} in {Path.cwd()}: run this from the root of "
            "the irrev repository, where the example policies are"
        )
    directory.mkdir(parents=True, exist_ok=True)
    for source in (examples / name for name in STACK_POLICIES):
        text = source.read_text(encoding="utf-8")
        text = re.sub(r'(supplier:\s*\{upstream:\s*)"[^"]*"', rf'\1"{supplier_url}"', text)
        (directory / source.name).write_text(text, encoding="utf-8")
    return directory


def wait_ready(
    url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} while starting")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready at {url} within {timeout_s:g} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class Server(NamedTuple):
    url: str
    pid: int


def uvicorn_command(app: str, port: int, *extra: str) -> list[str]:
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


@contextmanager
def service(
    command: list[str],
    port: int,
    ready_path: str,
    what: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[Server]:
    """Run `command` (a server on 127.0.0.1:`port`) until the block ends; yields once
    `ready_path` answers 200."""
    with open(log_path or os.devnull, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log if log_path else None)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + ready_path, process, what)
            yield Server(url, process.pid)
        finally:
            _stop(process)


@contextmanager
def supplier(port: int | None = None) -> Iterator[str]:
    """The demo supplier API in its own process; yields its base URL."""
    port = port or free_port()
    command = uvicorn_command("irrev.upstreams.supplier:create_supplier", port)
    with service(command, port, "/catalog", "the supplier API") as server:
        yield server.url


@contextmanager
def gateway(
    redis_url: str,
    policy_dir: Path,
    *,
    workers: int = 2,
    port: int | None = None,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """`irrev serve` in its own process; yields its base URL and pid."""
    port = port or free_port()
    environment = {
        **os.environ,
        "IRREV_REDIS_URL": redis_url,
        "IRREV_POLICY_DIR": str(policy_dir),
        "IRREV_ADMIN_TOKENS": f"operator={DEMO_ADMIN_TOKEN}",
        "IRREV_LOG_LEVEL": "warning",
        **(env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "irrev.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with service(command, port, "/readyz", "the gateway", environment, log_path) as server:
        yield server


def run_locust(
    locustfile: Path,
    url: str,
    users: int,
    spawn_rate: float,
    seconds: int,
    csv_prefix: Path,
    env: dict[str, str],
) -> list[dict[str, str]]:
    """Run a locust profile headless against `url` for a bounded time; returns the
    rows of its stats CSV (one per request name, and 'Aggregated')."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(locustfile),
            "--headless",
            "-u",
            str(users),
            "-r",
            str(spawn_rate),
            "-t",
            f"{max(1, seconds)}s",
            "--host",
            url,
            "--csv",
            str(csv_prefix),
            "--only-summary",
            "--stop-timeout",
            "5",
        ],
        env={**os.environ, **env},
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=seconds + 120,
    )
    with open(f"{csv_prefix}_stats.csv", newline="") as handle:
        return list(csv.DictReader(handle))
