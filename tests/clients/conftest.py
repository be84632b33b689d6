"""Client fixtures: a payments API that pays every request it gets (it does not
deduplicate: tests/clients/payments.py) and one `irrev serve --workers 2` on the
session's Redis in front of it, serving a fresh copy of examples/payments-api.yaml
(form-encoded charges by `checkout-01`; transfers by `payouts-01`, which escalate
above 5,000 USD).

Tests share both and keep to their own customer, destination and keys, so the
payments they count are their own.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from irrev.client import IrrevClient
from tests.gateway.conftest import Gateway, wait_for_workers
from tests.gateway.servers import BIN, Server, Tenant, base_env, write_policy


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
        "payments API",
        [str(BIN / "python"), "-m", "uvicorn", "tests.clients.payments:app"],
        base_env(),
        root / "payments.log",
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
    server = Server("gateway", [str(BIN / "irrev"), "serve"], env, root / "gateway.log")
    server.argv += ["--port", str(server.port), "--workers", "2"]
    server.start("/readyz")
    try:
        gateway = Gateway(server, redis_url, admin_token, {"payco": tenant})
        wait_for_workers(gateway, workers=2)
        yield Payments(gateway, tool_api)
    finally:
        server.stop()


@pytest.fixture
async def client(payments: Payments) -> AsyncIterator[IrrevClient]:
    """`checkout-01`'s client."""
    client = payments.client()
    yield client
    await client.aclose()


def fresh(prefix: str) -> str:
    """An id no other test uses (a customer, a destination, a thread, a key)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"
