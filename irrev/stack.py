"""A whole irrev stack on this machine, in real processes: a supplier API, gateway
workers and (from the caller) a Redis. Used by `irrev demo`, `irrev bench gateway`
and `irrev load`; everything listens on 127.0.0.1 only and is stopped on exit."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from irrev.cli import CliError
from irrev.harness import PolicyDraft, Server, free_port, running, uvicorn_command

EXAMPLES = Path("examples")
DEMO_ADMIN_TOKEN = "demo-admin-token-not-secret"
# Whose the demo admin token is: a person, as a real operator's token names one (the
# journal and the agents read `operator:alice` for its decisions).
DEMO_OPERATOR = "alice"
# The demos' --port: a known port lets a person watch a run from /console (with the
# demo admin token) or `irrev escalations list`.
PORT_HELP = "the gateway's port on 127.0.0.1 (default: a free one)"

# What the demo and load runs serve: the procurement tenant and its demo tokens. Only
# these: another example may need a secret (payments-api.yaml reads its API key from
# the environment), and one tenant that cannot load refuses the whole directory.
POLICY, DEMO_TOKENS = "procurement.yaml", "procurement.tokens.yaml"


def render_policies(
    directory: Path, supplier_url: str, examples: Path = EXAMPLES, *, mode: str = "enforce"
) -> Path:
    """Copy the procurement example and its demo tokens into `directory`, pointing the
    supplier tool at `supplier_url`; `mode` 'shadow' puts the tenant in shadow mode."""
    if not (examples / POLICY).is_file():
        raise CliError(
            f"no {examples / POLICY} in {Path.cwd()}: run this from the root of "
            "the irrev repository, where the example policies are"
        )
    policy = PolicyDraft.read(examples / POLICY).point(supplier_url, tools=("supplier",))
    policy.document["mode"] = mode
    policy.write(directory, POLICY)
    shutil.copyfile(examples / DEMO_TOKENS, directory / DEMO_TOKENS)
    return directory


@contextmanager
def service(
    command: list[str],
    port: int,
    ready_path: str,
    what: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
) -> Iterator[Server]:
    """Run `command` (a server on `host`:`port`, a loopback address) until the block
    ends; yields once `ready_path` answers 200."""
    server = Server(name=what, argv=command, env=env, log_path=log_path, port=port, host=host)
    with running(server, ready_path) as server:
        yield server


@contextmanager
def supplier(port: int | None = None) -> Iterator[str]:
    """The demo supplier API in its own process; yields its base URL."""
    port = port or free_port()
    command = uvicorn_command("irrev.upstreams.supplier:create_supplier", port)
    with service(command, port, "/catalog", "the supplier API") as server:
        yield server.url


def mcp_tools_server(state_dir: Path, port: int = 0, log_path: Path | None = None) -> Server:
    """The test MCP tool server (irrev/upstreams/mcp_tools.py) as an unstarted process,
    its effects kept under `state_dir`: start it, kill it (faults), start another on
    the same port and state to restart it."""
    port = port or free_port()
    command = [sys.executable, "-m", "uvicorn", "irrev.upstreams.mcp_tools:app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "MCP_TOOL_STATE": str(state_dir)}
    return Server(name="the MCP tool server", argv=command, env=env, log_path=log_path, port=port)


@contextmanager
def mcp_tools(
    state_dir: Path, port: int | None = None, log_path: Path | None = None
) -> Iterator[Server]:
    """mcp_tools_server, running until the block ends; yields the server (its URL, and
    kill for faults)."""
    with running(mcp_tools_server(state_dir, port or 0, log_path), "/ready") as server:
        yield server


@contextmanager
def gateway(
    redis_url: str,
    policy_dir: Path,
    *,
    workers: int = 2,
    port: int | None = None,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    prefix: list[str] | None = None,
) -> Iterator[Server]:
    """`irrev serve` in its own process on `host` (a loopback address); yields its
    base URL and pid. `prefix`: a command that runs it (e.g. faketime)."""
    port = port or free_port()
    environment = {
        **os.environ,
        "IRREV_REDIS_URL": redis_url,
        "IRREV_POLICY_DIR": str(policy_dir),
        "IRREV_ADMIN_TOKENS": f"{DEMO_OPERATOR}={DEMO_ADMIN_TOKEN}",
        "IRREV_LOG_LEVEL": "warning",
        **(env or {}),
    }
    command = [
        *(prefix or []),
        sys.executable,
        "-m",
        "irrev.cli",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with service(command, port, "/readyz", "the gateway", environment, log_path, host) as server:
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
