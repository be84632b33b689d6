"""MCP fixtures: the SDK-built tool server (irrev/upstreams/mcp_tools.py) as a real process,
and per Redis server one `irrev serve --workers 2` whose tenants are copies of
examples/mcp-fleet.yaml pointing at it, each at its own namespace of the tool server
(so each test's counts are its own). Agents are real MCP client sessions
(`mcp.Client` over Streamable HTTP) with their Bearer tokens."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import httpx
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ContentBlock, RequestParamsMeta, TextContent

from irrev.harness import PolicyDraft, new_token
from pricing.credentials import hash_token
from tests.gateway.conftest import KEEP_ALIVE_S, Gateway, wait_for_workers
from tests.gateway.servers import BIN, EXAMPLES, Server, base_env

WORKERS = 2
UPSTREAM_TIMEOUT_S = 2.0
FLEET = 50
KEY_META: Final = "dev.irrev/idempotency_key"


def key(value: object = None) -> RequestParamsMeta:
    """`_meta` with an idempotency key (`value`, whatever it is, else a fresh one), as
    a client that sends its own does. RequestParamsMeta is open to any key (PEP 728
    `extra_items`), which mypy does not implement yet: hence the cast."""
    return cast(RequestParamsMeta, {KEY_META: uuid.uuid4().hex if value is None else value})


def text_of(block: ContentBlock) -> str:
    """The text of a content block the gateway answers with (always text)."""
    assert isinstance(block, TextContent), block
    return block.text


def structured(result: CallToolResult) -> dict[str, Any]:
    """A tool result's structured content, which every answer of the gateway has."""
    assert result.structured_content is not None, result
    return result.structured_content


def start_tool_server(state_dir: Path, log_dir: Path, port: int | None = None) -> Server:
    server = Server(
        name="mcp tools",
        argv=[str(BIN / "python"), "-m", "uvicorn", "irrev.upstreams.mcp_tools:app"],
        env=base_env(MCP_TOOL_STATE=str(state_dir)),
        log_path=log_dir / "mcp-tools.log",
    )
    if port is not None:
        server.port = port
    server.argv += ["--host", "127.0.0.1", "--port", str(server.port), "--log-level", "warning"]
    # A call left hanging by a test's fault (a delay, hang_after_effect) held a graceful
    # stop until Server.stop's 15 s ran out, at the end of every run.
    server.argv += ["--timeout-graceful-shutdown", "1"]
    server.start("/ready")
    return server


@dataclass(frozen=True)
class McpTenant:
    """A tenant served by the gateway: its id, agents' and admin's tokens, and the
    tool-server namespace its MCP servers live at."""

    id: str
    tokens: dict[str, str]
    admin: str
    namespace: str
    tool_server: str

    def auth(self, agent: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[agent]}"}

    @property
    def admin_auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}


def write_mcp_policy(
    directory: Path,
    tenant: str,
    tool_server: str,
    fleet: int = 0,
    admin_role: str = "approver",
    **overrides: Any,
) -> McpTenant:
    """examples/mcp-fleet.yaml as `tenant`, with fresh tokens, its MCP servers at the
    tool server's namespace `tenant`, `fleet` extra buyers (fleet-00...) and top-level
    keys replaced by `overrides`."""
    policy = PolicyDraft.read(EXAMPLES / "mcp-fleet.yaml").named(tenant)
    data = policy.document
    for i in range(fleet):
        data["agents"][f"fleet-{i:02d}"] = {**data["agents"]["buyer-01"]}
    tokens = policy.fresh_tokens().tokens
    admin = new_token()
    data["admins"]["alice"] = {"token_sha256": hash_token(admin), "role": admin_role}
    data.update(overrides)
    for tool in data["tools"].values():
        if "mcp" in tool:
            tool["mcp"] = f"{tool_server}/{tenant}/mcp"
    policy.write(directory)
    return McpTenant(tenant, tokens, admin, tenant, tool_server)


TENANTS: dict[str, dict[str, Any]] = {
    "basics": {},
    "deny": {},
    # Its calls that escalate answer at once (the default waits for the decision).
    "escalate": {"routes": {"escalation_wait": "0"}},
    # Keyless hosts (issue 29): escalations answered at once, or after a wait.
    "keyless": {"routes": {"escalation_wait": "0"}},
    "keyless-wait": {"routes": {"escalation_wait": "15s"}},
    # Identical keyless calls are meant to repeat here: each is an effect of its own.
    "repeats": {"routes": {"dedupe_window": "0"}},
    "repeats-now": {"routes": {"dedupe_window": "0", "escalation_wait": "0"}},
    "fleet": {"fleet": FLEET},
    "one-key": {},
    # A repeat of an ambiguous call answers from the ledger: its server may not dedupe.
    "retry-ledger": {"routes": "flaky-lookup"},
    # Its procure server declares that it deduplicates: a repeat may be sent again.
    "retry-dedupes": {"tools": {"procure": {"mcp": "", "dedupes": True}, "github": {"mcp": ""}}},
    "hostile": {},
    # No answer is kept whole for a repeat: each is kept without its body.
    "no-bodies": {"request_limits": {"kept_answer_bytes": 0}},
    # Its buyer-01 is suspended and resumed by an operator (test_mcp_suspend.py).
    "suspend": {},
    # Its MCP server is called "vault": a name the "hostile" tenant does not have.
    "hostile-other": {"rename": "vault"},
    # An HTTP tool beside its MCP servers, unknown routes priced: /mcp must not reach it.
    "mixed": {
        "tools": {
            "procure": {"mcp": ""},
            "github": {"mcp": ""},
            "web": {"upstream": "http://127.0.0.1:9"},
        },
        "unknown_routes": {"action": "price_as_irreversible", "face_value": "amount"},
    },
    # Its admin alice is a policy_admin: may change its policy, not where calls go.
    "upload": {"admin_role": "policy_admin"},
    "bench": {
        "accounts": {
            "tenant": {"limit": "9000000"},
            "principals": {"procurement": {"limit": "9000000"}, "platform": {"limit": "20000"}},
            "risk_factors": {"supplier:*": {"limit": "9000000"}, "repo:*": {"limit": "10000"}},
        }
    },
}


def _routes_with(fields: dict[str, Any]) -> list[dict[str, Any]]:
    """The example's routes, every CALL route's with `fields` added."""
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "mcp-fleet.yaml").read_text())[
        "routes"
    ]
    return [{**route, **fields} if route.get("class") != "read" else route for route in routes]


def _flaky_with_lookup() -> list[dict[str, Any]]:
    """The example's routes, flaky_order's with the reconciler's lookup tool."""
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "mcp-fleet.yaml").read_text())[
        "routes"
    ]
    for route in routes:
        if route["route"] == "CALL procure/flaky_order":
            route["lookup"] = "CALL procure/find_effect"
    return routes


def _renamed(server: str) -> dict[str, Any]:
    """The example's procure server and its routes under another name."""
    data = yaml.safe_load((EXAMPLES / "mcp-fleet.yaml").read_text())
    data["tools"][server] = data["tools"].pop("procure")
    for route in data["routes"]:
        if route["tool"] == "procure":
            route["tool"] = server
            route["route"] = route["route"].replace("procure/", f"{server}/")
            if "lookup" in route:
                route["lookup"] = route["lookup"].replace("procure/", f"{server}/")
    return {"tools": data["tools"], "routes": data["routes"]}


@dataclass
class McpGateway:
    gateway: Gateway
    tool_server: Server
    tenants: dict[str, McpTenant] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.gateway.url

    def tenant(self, name: str) -> McpTenant:
        return self.tenants[name]


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("mcp-tools")
    server = start_tool_server(root / "state", root)
    yield server
    server.stop()


def serve(root: Path, redis_url: str, policy_dir: Path, **settings: str) -> Gateway:
    admin_token = secrets.token_urlsafe(24)
    defaults = {
        "IRREV_UPSTREAM_TIMEOUT_S": str(UPSTREAM_TIMEOUT_S),
        "IRREV_UPSTREAM_CONNECT_TIMEOUT_S": "1",
        "IRREV_FORWARD_MARGIN_S": "0.5",
        "IRREV_SWEEP_INTERVAL_S": "0.5",
        "IRREV_BODY_TIMEOUT_S": "1",
    }
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policy_dir),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        **{**defaults, **settings},
    )
    server = Server(
        name="gateway", argv=[str(BIN / "irrev"), "serve"], env=env, log_path=root / "gateway.log"
    )
    server.argv += ["--port", str(server.port), "--workers", str(WORKERS)]
    server.start("/readyz")
    gateway = Gateway(server, redis_url, admin_token)
    wait_for_workers(gateway, workers=WORKERS)
    return gateway


@pytest.fixture(scope="session")
def mcp_gateway(
    redis_url: str, tool_server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[McpGateway]:
    root = tmp_path_factory.mktemp("mcp-gateway")
    policy_dir = root / "policies"
    policy_dir.mkdir()
    run = uuid.uuid4().hex[:8]
    tenants = {}
    for name, options in TENANTS.items():
        options = dict(options)
        fleet = options.pop("fleet", 0)
        role = options.pop("admin_role", "approver")
        if "rename" in options:
            options = _renamed(options.pop("rename"))
        if options.get("routes") == "flaky-lookup":
            options["routes"] = _flaky_with_lookup()
        elif isinstance(options.get("routes"), dict):
            options["routes"] = _routes_with(options["routes"])
        tenants[name] = write_mcp_policy(
            policy_dir, f"mcp-{name}-{run}", tool_server.url, fleet, role, **options
        )
    gateway = serve(root, redis_url, policy_dir)
    yield McpGateway(gateway, tool_server, tenants)
    gateway.server.stop()


@asynccontextmanager
async def agent(url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    """A real MCP client session of an agent (Streamable HTTP, its Bearer token)."""
    limits = httpx2.Limits(keepalive_expiry=KEEP_ALIVE_S)
    async with httpx2.AsyncClient(
        headers=headers, timeout=30.0, limits=limits, trust_env=False
    ) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, cache=None) as client:
            yield client


@pytest.fixture
async def tools_http(tool_server: Server) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(keepalive_expiry=KEEP_ALIVE_S)
    async with httpx.AsyncClient(
        base_url=tool_server.url, timeout=10.0, limits=limits, trust_env=False
    ) as c:
        yield c


@pytest.fixture
async def http(mcp_gateway: McpGateway) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(keepalive_expiry=KEEP_ALIVE_S)
    async with httpx.AsyncClient(
        base_url=mcp_gateway.url, timeout=30.0, limits=limits, trust_env=False
    ) as c:
        yield c


async def tool_stats(tools_http: httpx.AsyncClient, tenant: McpTenant) -> dict[str, Any]:
    response = await tools_http.get(f"/{tenant.namespace}/_stats")
    assert response.status_code == 200
    stats: dict[str, Any] = response.json()
    return stats


def order(quantity: int = 10, unit_price: str = "100", supplier_id: str = "s1") -> dict[str, Any]:
    """An order's arguments; its face value is quantity * unit_price USD."""
    return {
        "supplier_id": supplier_id,
        "sku": "bolts",
        "quantity": quantity,
        "unit_price": unit_price,
    }
