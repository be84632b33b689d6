"""Client fixtures: a payments API that pays every request it gets (it does not
deduplicate: tests/clients/payments.py) and one `irrev serve --workers 2` on the
session's Redis in front of it, serving a fresh copy of examples/payments-api.yaml
(form-encoded charges by `checkout-01`; transfers by `payouts-01`, which escalate
above 5,000 USD).

For MCP hosts: a payments MCP server that pays every call (tests/clients/mcp_payments.py)
and another `irrev serve --workers 2` whose tenants are copies of
examples/mcp-payments.yaml calling it: `host` answers an escalated call at once,
`host-wait` waits the route's default 20 s for the decision.

Tests share them and keep to their own customer, destination, recipient and keys, so
the payments they count are their own.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from irrev.client import IrrevClient
from irrev.harness import PolicyDraft
from tests.gateway.conftest import Gateway, wait_for_workers
from tests.gateway.servers import BIN, EXAMPLES, Server, Tenant, base_env, write_policy
from tests.mcp.conftest import serve


@dataclass(frozen=True)
class Payments:
    """The gateway, its tenant and the tool API behind it."""

    gateway: Gateway
    tool_api: Server

    @property
    def tenant(self) -> Tenant:
        return self.gateway.tenant("payco")

    def client(self, agent: str = "checkout-01", **options: Any) -> IrrevClient:
        return IrrevClient(
            self.gateway.url, self.tenant.tokens[agent], **{"pause_s": 0.2, **options}
        )

    async def made(self, **fields: str) -> list[dict[str, Any]]:
        """The payments the tool API made whose fields include `fields`."""
        async with httpx.AsyncClient(base_url=self.tool_api.url, trust_env=False) as http:
            every: list[dict[str, Any]] = (await http.get("/_payments")).json()
        return [p for p in every if fields.items() <= p.items()]

    async def decide(self, escalation: str, verdict: str, note: str = "") -> httpx.Response:
        """An operator approves or rejects `escalation`, with `note` as the reason."""
        async with httpx.AsyncClient(base_url=self.gateway.url, trust_env=False) as http:
            return await http.post(
                f"/v1/escalations/{escalation}/{verdict}",
                json={"reason": note} if note else None,
                headers=self.gateway.admin,
            )


@pytest.fixture(scope="session")
def tool_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("payments-api")
    server = Server(
        name="payments API",
        argv=[str(BIN / "python"), "-m", "uvicorn", "tests.clients.payments:app"],
        env=base_env(),
        log_path=root / "payments.log",
    )
    server.argv += ["--host", "127.0.0.1", "--port", str(server.port), "--log-level", "warning"]
    server.start("/_ready")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def payments(
    redis_url: str, tool_api: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Payments]:
    root = tmp_path_factory.mktemp("clients-gateway")
    tenant = write_policy(
        root / "policies", "payments-api", f"payco-{uuid.uuid4().hex[:10]}", tool_api.url
    )
    admin_token = secrets.token_urlsafe(24)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(root / "policies"),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        PAYMENTS_API_KEY="sk_test_clients",
    )
    server = Server(
        name="gateway", argv=[str(BIN / "irrev"), "serve"], env=env, log_path=root / "gateway.log"
    )
    server.argv += ["--port", str(server.port), "--workers", "2"]
    server.start("/readyz")
    try:
        gateway = Gateway(server, redis_url, admin_token, {"payco": tenant})
        wait_for_workers(gateway, workers=2)
        yield Payments(gateway, tool_api)
    finally:
        server.stop()


@dataclass(frozen=True)
class McpPayments:
    """The gateway of MCP hosts, its tenants and the payments MCP server behind it."""

    gateway: Gateway
    tool_server: Server

    def token(self, tenant: str) -> str:
        """`assistant-01`'s token in `tenant` (`host` or `host-wait`)."""
        return self.gateway.tenant(tenant).tokens["assistant-01"]

    async def paid(self, recipient: str) -> list[dict[str, Any]]:
        """The payments the server made to `recipient`, in order."""
        async with httpx.AsyncClient(base_url=self.tool_server.url, trust_env=False) as http:
            every: list[dict[str, Any]] = (await http.get("/_payments")).json()
        return [p for p in every if p["recipient"] == recipient]

    async def fail_next(self, fault: str) -> None:
        """The server's next payment is made, then not answered (`timeout` or `504`)."""
        async with httpx.AsyncClient(base_url=self.tool_server.url, trust_env=False) as http:
            response = await http.post("/_faults", json={"next": fault})
        assert response.status_code == 200, response.text

    async def queue(self, tenant: str) -> set[str]:
        """The escalations waiting in `tenant`'s approval queue."""
        async with httpx.AsyncClient(base_url=self.gateway.url, trust_env=False) as http:
            response = await http.get(
                f"/v1/admin/tenants/{self.gateway.tenant(tenant).id}/escalations",
                headers=self.gateway.admin,
                params={"limit": 200},
            )
        assert response.status_code == 200, response.text
        return {item["escalation"] for item in response.json()["escalations"]}

    async def approve(self, escalation: str, note: str) -> None:
        """An operator approves `escalation`, saying `note`."""
        async with httpx.AsyncClient(base_url=self.gateway.url, trust_env=False) as http:
            response = await http.post(
                f"/v1/escalations/{escalation}/approve",
                json={"reason": note},
                headers=self.gateway.admin,
            )
        assert response.status_code == 200, response.text


def write_host_tenant(directory: Path, tenant: str, tool_server: str, **route: str) -> Tenant:
    """examples/mcp-payments.yaml as `tenant`, with a fresh agent token, calling
    `tool_server`, its route's fields replaced by `route`. Without the example's tenant
    admin (two tenants cannot share a token): the gateway's operator approves."""
    policy = PolicyDraft.read(EXAMPLES / "mcp-payments.yaml").named(tenant).fresh_tokens()
    document = policy.document
    document["tools"]["payments"]["mcp"] = f"{tool_server}/mcp"
    document["routes"] = [{**each, **route} for each in document["routes"]]
    del document["admins"]
    policy.write(directory)
    return Tenant(tenant, policy.tokens, tool_server)


@pytest.fixture(scope="session")
def mcp_tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("mcp-payments")
    server = Server(
        name="payments MCP server",
        argv=[str(BIN / "python"), "-m", "uvicorn", "tests.clients.mcp_payments:app"],
        env=base_env(MCP_PAYMENTS_LEDGER=str(root / "paid.jsonl")),
        log_path=root / "mcp-payments.log",
    )
    server.argv += ["--host", "127.0.0.1", "--port", str(server.port), "--log-level", "warning"]
    # A payment left hanging by a test's fault would hold a graceful stop for its 30 s.
    server.argv += ["--timeout-graceful-shutdown", "1"]
    server.start("/_ready")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mcp_payments(
    redis_url: str, mcp_tool_server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[McpPayments]:
    root = tmp_path_factory.mktemp("mcp-hosts-gateway")
    run = uuid.uuid4().hex[:8]
    tenants = {
        "host": write_host_tenant(
            root / "policies", f"host-{run}", mcp_tool_server.url, escalation_wait="0"
        ),
        "host-wait": write_host_tenant(root / "policies", f"host-wait-{run}", mcp_tool_server.url),
    }
    gateway = serve(root, redis_url, root / "policies")
    gateway.tenants.update(tenants)
    yield McpPayments(gateway, mcp_tool_server)
    gateway.server.stop()


@pytest.fixture
async def client(payments: Payments) -> AsyncIterator[IrrevClient]:
    """`checkout-01`'s client."""
    client = payments.client()
    yield client
    await client.aclose()


def fresh(prefix: str) -> str:
    """An id no other test uses (a customer, a destination, a thread, a key)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"
