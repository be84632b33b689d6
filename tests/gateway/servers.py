"""Real processes for the gateway tests: the supplier upstream, `irrev serve` with
several workers, and the tenant policies they serve (copies of the examples with a
fresh tenant id, fresh agent tokens and the test's own upstream).

Everything binds to 127.0.0.1; every wait polls with a deadline.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from irrev import harness
from irrev.harness import PolicyDraft

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


@dataclass(kw_only=True)
class Server(harness.Server):
    """A harness server run from the repository's root (tests/ on its import path)."""

    cwd: Path | None = ROOT


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRREV_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def start_suppliers(log_dir: Path) -> Server:
    server = Server(
        name="suppliers",
        argv=[str(BIN / "python"), "-m", "uvicorn", "tests.gateway.suppliers:app"],
        env=base_env(),
        log_path=log_dir / "suppliers.log",
    )
    server.argv += ["--host", "127.0.0.1", "--port", str(server.port), "--log-level", "warning"]
    server.start("/ready/catalog")
    return server


class Tenanted(Protocol):
    """What the admin API and `irrev ledger audit` know a tenant by: its id (a Tenant
    here, an McpTenant of the MCP tests)."""

    @property
    def id(self) -> str: ...


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
    policy = PolicyDraft.read(EXAMPLES / f"{example}.yaml").named(tenant).fresh_tokens()
    policy.point(supplier_url).fresh_settlers()
    policy.document.update(overrides)
    policy.write(directory)
    return Tenant(tenant, policy.tokens, supplier_url, policy.settlers)


def start_scripted(name: str, log_dir: Path, host: str, port: int | None = None) -> Server:
    """A tool API whose answer the test scripts (tests/gateway/scripted.py, `script`)."""
    server = Server(
        name=name,
        argv=[str(BIN / "python"), "-m", "uvicorn", "tests.gateway.scripted:app"],
        env=base_env(),
        log_path=log_dir / f"{name}.log",
        host=host,
    )
    if port is not None:
        server.port = port
    server.argv += ["--host", host, "--port", str(server.port), "--log-level", "warning"]
    server.start("/_ready")
    return server


async def script(server: Server, status: int, body: Any, **headers: str) -> None:
    """What a scripted tool API answers every request from now on."""
    answer = {
        "status": status,
        "headers": [[name.replace("_", "-"), value] for name, value in headers.items()],
        "body": body if isinstance(body, str) else json.dumps(body),
    }
    async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
        (await client.post("/_script", json=answer)).raise_for_status()


async def seen(server: Server) -> list[dict[str, str]]:
    """The requests a scripted tool API received so far."""
    async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
        response = await client.get("/_seen")
    return list(response.json())
