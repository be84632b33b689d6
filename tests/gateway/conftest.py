"""Gateway fixtures: one supplier server for the session, and per Redis server one
`irrev serve --workers 2` with a policy directory of fresh tenants.

Policies fix tenant ids, so every test gets its own copy of an example policy under
a fresh id (`gateway.tenant("name")`), declared in TENANTS below and written before
the gateway starts: its balances, holds and supplier counts are its own.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from irrev.harness import free_port, new_token
from pricing.credentials import hash_token

from .servers import (
    BIN,
    EXAMPLES,
    Server,
    Tenant,
    base_env,
    start_suppliers,
    write_policy,
)

WORKERS = 2
# Long enough that a loaded 2-core CI machine does not turn an honest forward into a
# timeout (1 s did, once in ~700 tests); tests of timeouts delay past it.
UPSTREAM_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 1.0
MAX_BODY_BYTES = 64 * 1024

# The example's routes with the in-process deploy route compensable (a rollback
# recovers most of it), its p_fail learned from rollbacks, and agents' overrun
# reports allowed.
LEARNED_DEPLOY = {
    "tool": "deploy",
    "route": "POST /deploys",
    "class": "compensable",
    "face_value_fixed": "1000",
    "in_process": True,
    "overrun_report": True,
    "pricing": {
        "model": "expected",
        "recovery": {"alpha": 19, "beta": 1},
        "p_fail": {"alpha": 1, "beta": 99, "level": 0.95},
    },
}
_PROCUREMENT = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
LEARNING_ROUTES = [
    LEARNED_DEPLOY if route["tool"] == "deploy" else route for route in _PROCUREMENT["routes"]
]
SMALL_PLATFORM = {
    **_PROCUREMENT["accounts"],
    "principals": {**_PROCUREMENT["accounts"]["principals"], "platform": {"limit": "500"}},
}

# Routes of the `readers-` tenants, whose upstream reports how several parsers read
# each request (irrev/upstreams/readers.py): amounts at face value, so a price is an amount.
READER_ROUTES: list[dict[str, Any]] = [
    {
        "tool": "payments",
        "route": "POST /refunds",
        "class": "irreversible",
        # `note`: a free-text field, declared (undeclared ones are refused).
        "body": ["customer_id", "amount", "note"],
        "face_value": "amount",
        "risk_factors": ["customer:{customer_id}"],
    },
    {
        "tool": "payments",
        "route": "POST /transfers",
        "class": "irreversible",
        "query": ["amount"],
        "face_value": "amount",
    },
    {
        "tool": "payments",
        "route": "POST /charges",
        "class": "irreversible",
        "body_format": "form",
        "body": ["customer_id", "amount", "currency"],
        "face_value": "amount",
        "amount_scale": 100,
        "currency_field": "currency",
        "risk_factors": ["customer:{customer_id}"],
    },
    {"tool": "payments", "route": "GET /refunds/{refund_id}", "class": "read"},
]
READERS = {
    "routes": READER_ROUTES,
    "unknown_routes": {"action": "price_as_irreversible", "face_value": "amount"},
}


# The URLs of live peer gateways of the session's gateway (`peer_gateway`): a tenant's
# fleet gauges come from whichever gateway holds its sweep lease, so a scrape of the
# fleet reads them all (helpers.scrape_fleet).
PEERS: list[str] = []

RETRY_SUPPLIER_PORT = free_port()
# Where test_client.py runs a tool API whose answers it scripts (tests/gateway/scripted.py).
SCRIPTED_PORT = free_port()


def _example_accounts(**replaced: Any) -> dict[str, Any]:
    accounts: dict[str, Any] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())[
        "accounts"
    ]
    return {**accounts, **replaced}


def _two_factor_orders() -> dict[str, Any]:
    """procurement, with orders capped per supplier and per SKU: two factor accounts
    that a first order to a new supplier of a new SKU meets together."""
    data = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    for route in data["routes"]:
        if route["route"] == "POST /orders":
            route["risk_factors"].append("sku:{sku}")
    data["accounts"]["risk_factors"]["sku:*"] = {"limit": "100000"}
    return {"routes": data["routes"], "accounts": data["accounts"]}


def _keyless_orders() -> dict[str, Any]:
    """procurement, with supplier orders sent without an Idempotency-Key keyed by their
    content (issue 29), and roomy accounts for the escalations its tests make."""
    data = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    for route in data["routes"]:
        if route["route"] == "POST /orders":
            route["keyless"] = "content"
    roomy = _example_accounts(tenant={"limit": "10000000"})
    roomy["principals"]["procurement"] = {"limit": "10000000"}
    roomy["risk_factors"]["supplier:*"] = {"limit": "10000000"}
    return {"routes": data["routes"], "accounts": roomy}


def _flooded_orders() -> dict[str, Any]:
    """procurement, with every supplier order above 50 USD waiting for a human."""
    data = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    for route in data["routes"]:
        if route["route"] == "POST /orders":
            route["approval_threshold"] = "50"
    return {"routes": data["routes"]}


def _shadow_orders_only() -> dict[str, Any]:
    """procurement as written, with supplier orders (only) in shadow mode."""
    data = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    for route in data["routes"]:
        if route["route"] == "POST /orders":
            route["mode"] = "shadow"
    return {"routes": data["routes"]}


def _shadow_orders() -> dict[str, Any]:
    """procurement with a tenant budget of 1 USD, and supplier orders (only) in shadow
    mode: every order is a would-be denial, forwarded anyway; refunds are enforced."""
    data = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    for route in data["routes"]:
        if route["route"] == "POST /orders":
            route["mode"] = "shadow"
    return {"routes": data["routes"], "accounts": _example_accounts(tenant={"limit": "1"})}


def _refused_often() -> dict[str, Any]:
    """procurement, where facilities' agents are refused by the budget (its limit is
    1 USD) and platform's deployer may call only its deploy tool."""
    accounts = _example_accounts()
    accounts["principals"]["facilities"] = {"limit": "1"}
    accounts["principals"]["platform"] = {"limit": "10000", "routes": ["deploy *"]}
    return {"accounts": accounts}


# A tenant admin of `console-ops` who may approve but not raise a limit (test_console.py).
CONSOLE_APPROVER = new_token()

# A tenant admin of `console-keys` who may manage viewer and approver keys, not agents'.
CONSOLE_KEYS_APPROVER = new_token()

# Tenant admins of `cli-loop` who drive `irrev escalations` and `irrev holds`
# (test_admin_cli.py): one may decide, one may only look.
CLI_APPROVER = new_token()
CLI_VIEWER = new_token()


def _cli_loop() -> dict[str, Any]:
    """procurement, whose in-process deploys escalate (a decision-only approval), with
    an approver and a viewer of its own."""
    threshold = {"approval_threshold": "500"}
    routes = [
        {**route, **threshold} if route["tool"] == "deploy" else route
        for route in _PROCUREMENT["routes"]
    ]
    admins = {
        "cleo": {"token_sha256": hash_token(CLI_APPROVER), "role": "approver"},
        "vic": {"token_sha256": hash_token(CLI_VIEWER), "role": "viewer"},
    }
    return {"routes": routes, "admins": admins}


# name -> (example policy, top-level overrides)
TENANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "basics": ("procurement", {}),
    "cookies": ("procurement", {}),
    "bad-input": ("procurement", {}),
    "paths": ("procurement", {}),
    "decision": ("procurement", {}),
    "overrun": ("procurement", {"routes": LEARNING_ROUTES, "accounts": SMALL_PLATFORM}),
    "decision-budget": ("procurement", {}),
    "overdraw": ("procurement", {}),
    # One agent sends one key 20 times at once: more than a worker's default bound on
    # an agent's requests in flight (request_limits.max_in_flight, 16).
    "idempotency": ("procurement", {"request_limits": {"max_in_flight": 64}}),
    "approvals": ("procurement", {}),
    "outcomes": ("procurement", {}),
    # A short hold TTL, so that a hold's deadline passes within a test.
    "short-ttl": ("procurement", {"hold_ttl": "5s", "escalation_ttl": "2s"}),
    # A deadline that passes within a test, with room before it for the test's own
    # steps on a loaded machine.
    "reconcile-ttl": ("procurement", {"hold_ttl": "8s"}),
    "retry-race": ("procurement", {"hold_ttl": "5s", "escalation_ttl": "2s"}),
    "retry-claim": ("procurement", {}),
    "retry-trace": ("procurement", {}),
    "accept": ("procurement", {}),
    "not-acceptable": ("procurement", {}),
    "unsendable": ("procurement", {}),
    "trace-context": ("procurement", {}),
    # Its supplier tool points at a port nobody listens on.
    "unreachable": (
        "procurement",
        {
            "tools": {
                "supplier": {"upstream": f"http://127.0.0.1:{free_port()}"},
                "payments": {"upstream": f"http://127.0.0.1:{free_port()}"},
                "deploy": {},
            }
        },
    ),
    # Its supplier tool points at RETRY_SUPPLIER_PORT, where a test runs a supplier of
    # its own that it can kill between an ambiguous send and its retry.
    "retry-unsent": (
        "procurement",
        {
            "tools": {
                "supplier": {"upstream": f"http://127.0.0.1:{RETRY_SUPPLIER_PORT}"},
                "payments": {"upstream": f"http://127.0.0.1:{RETRY_SUPPLIER_PORT}"},
                "deploy": {},
            }
        },
    ),
    "iso-acme": ("procurement", {}),
    "iso-globex": ("globex", {}),
    "admin-a": ("procurement", {}),
    "admin-b": ("procurement", {}),
    "policy-changes": ("procurement", {}),
    "policy-cli": ("procurement", {}),
    "fuzz": ("procurement", {}),
    "fuzz-globex": ("globex", {}),
    "settle-abuse": ("procurement", {}),
    "settle-roles": ("procurement", {}),
    "settle-bounds": ("procurement", {}),
    "settle-learn": ("procurement", {"routes": LEARNING_ROUTES}),
    "settle-upload": ("procurement", {"routes": LEARNING_ROUTES}),
    "readers-canon": ("procurement", READERS),
    "two-factors": ("procurement", _two_factor_orders()),
    # A tenant budget of 1 USD: every order but a free one is refused.
    "tight": ("procurement", {"accounts": _example_accounts(tenant={"limit": "1"})}),
    "hygiene": ("procurement", {}),
    "unknown-routes": ("globex", {}),
    # Unknown routes priced, deploy among the tools: it has no upstream to forward to.
    "unknown-no-upstream": (
        "procurement",
        {"unknown_routes": {"action": "price_as_irreversible", "face_value": "amount"}},
    ),
    "ops": ("procurement", {}),
    # Shadow mode for the whole tenant, on a 2000 USD budget; and for one route.
    "shadow": (
        "procurement",
        {"mode": "shadow", "accounts": _example_accounts(tenant={"limit": "2000"})},
    ),
    "shadow-route": ("procurement", _shadow_orders()),
    # An enforced tenant whose supplier orders alone are in shadow mode (issue 26).
    "shadow-isolation": ("procurement", _shadow_orders_only()),
    "keyless": ("procurement", _keyless_orders()),
    # One agent floods the approval queue (issue 26): roomy budgets, the default cap.
    "flood": ("procurement", _flooded_orders()),
    "dashboards": ("procurement", {}),
    # irrev/client.py and its LangChain adapter, as an agent uses them.
    "client": ("procurement", {}),
    # Its supplier is the scripted tool API at SCRIPTED_PORT: 202s with foreign
    # Locations, problem+json of its own.
    "client-scripted": (
        "procurement",
        {
            "tools": {
                "supplier": {"upstream": f"http://127.0.0.1:{SCRIPTED_PORT}"},
                "payments": {"upstream": f"http://127.0.0.1:{SCRIPTED_PORT}"},
                "deploy": {},
            }
        },
    ),
    # `irrev escalations` and `irrev holds` (test_admin_cli.py), and a tenant its
    # admins cannot reach.
    "cli-loop": ("procurement", _cli_loop()),
    "cli-other": ("procurement", {}),
    # The operator console in a browser (test_console.py).
    "console": ("procurement", {}),
    "console-resolve": ("procurement", {}),
    # Refusals counted for the operator, and the account that tripped (issue 26).
    "refusals": ("procurement", _refused_often()),
    "tripped": ("procurement", {}),
    # The console's refusals view, bulk decisions and rules (test_console.py).
    # The console's Keys panel (test_console.py).
    "console-keys": (
        "procurement",
        {
            "admins": {
                "kim": {"token_sha256": hash_token(CONSOLE_KEYS_APPROVER), "role": "approver"}
            }
        },
    ),
    "console-ops": (
        "procurement",
        {
            **_flooded_orders(),
            "admins": {"ann": {"token_sha256": hash_token(CONSOLE_APPROVER), "role": "approver"}},
        },
    ),
}


@dataclass
class Gateway:
    server: Server
    redis_url: str
    admin_token: str
    tenants: dict[str, Tenant] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def tenant(self, name: str) -> Tenant:
        return self.tenants[name]

    def worker_pids(self) -> set[int]:
        """Workers that logged "gateway ready" (JSON lines from every worker)."""
        return {int(e["pid"]) for e in self.log_entries() if e.get("msg") == "gateway ready"}

    def log_entries(self) -> list[dict[str, Any]]:
        """The workers' JSON log lines so far."""
        entries = []
        for line in self.server.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                entries.append(json.loads(line))
        return entries


@pytest.fixture(scope="session")
def suppliers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_suppliers(tmp_path_factory.mktemp("suppliers"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("gateway")
    policy_dir = root / "policies"
    policy_dir.mkdir()
    run = uuid.uuid4().hex[:10]
    tenants = {}
    for name, (example, overrides) in TENANTS.items():
        tenant_id = f"{name}-{run}"
        supplier_url = f"{suppliers.url}/{tenant_id}"
        tenants[name] = write_policy(policy_dir, example, tenant_id, supplier_url, **overrides)
    admin_token = secrets.token_urlsafe(24)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policy_dir),
        IRREV_ADMIN_TOKENS=f"ops={admin_token},oncall={secrets.token_urlsafe(24)}",
        IRREV_UPSTREAM_TIMEOUT_S=str(UPSTREAM_TIMEOUT_S),
        IRREV_UPSTREAM_CONNECT_TIMEOUT_S="1",
        IRREV_FORWARD_MARGIN_S="0.5",
        IRREV_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
        IRREV_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        IRREV_SWEEP_INTERVAL_S="0.5",
    )
    server = Server(
        name="gateway", argv=[str(BIN / "irrev"), "serve"], env=env, log_path=root / "gateway.log"
    )
    server.argv += ["--port", str(server.port), "--workers", str(WORKERS)]
    server.start("/readyz")
    gateway = Gateway(server, redis_url, admin_token, tenants)
    wait_for_workers(gateway)
    yield gateway
    server.stop()


@pytest.fixture(scope="session")
def peer_gateway(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A second, independent `irrev serve` on the same Redis and policies: which worker
    of one server accepts a connection is the kernel's choice, so a test that needs
    effects admitted by several processes for certain sends to both servers."""
    root = tmp_path_factory.mktemp("peer-gateway")
    server = Server(
        name="peer gateway",
        argv=[str(BIN / "irrev"), "serve"],
        env=gateway.server.env,
        log_path=root / "gateway.log",
    )
    server.argv += ["--port", str(server.port), "--workers", "1"]
    server.start("/readyz")
    peer = Gateway(server, gateway.redis_url, gateway.admin_token, gateway.tenants)
    wait_for_workers(peer, workers=1)
    PEERS.append(server.url)
    yield peer
    PEERS.remove(server.url)
    server.stop()


@contextmanager
def own_gateway(
    redis_url: str,
    suppliers: Server,
    root: Path,
    workers: int,
    policy: dict[str, Any] | None = None,
    **settings: str,
) -> Iterator[Gateway]:
    """A gateway of its own, with extra IRREV_* settings, serving one fresh tenant
    (`.tenant("own")`, the procurement example with `policy`'s top-level keys
    replaced), for tests whose settings would disturb the shared gateway."""
    policies = root / "policies"
    policies.mkdir()
    tenant_id = f"own-{secrets.token_hex(5)}"
    supplier = f"{suppliers.url}/{tenant_id}"
    tenant = write_policy(policies, "procurement", tenant_id, supplier, **(policy or {}))
    admin_token = secrets.token_urlsafe(24)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policies),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        **settings,
    )
    server = Server(
        name="own gateway",
        argv=[str(BIN / "irrev"), "serve"],
        env=env,
        log_path=root / "gateway.log",
    )
    server.argv += ["--port", str(server.port), "--workers", str(workers)]
    server.start("/readyz")
    try:
        gateway = Gateway(server, redis_url, admin_token, {"own": tenant})
        wait_for_workers(gateway, workers=workers)
        yield gateway
    finally:
        server.stop()


def wait_for_workers(gateway: Gateway, deadline_s: float = 30.0, workers: int = WORKERS) -> None:
    """Every worker has finished its startup (and so accepts connections)."""
    deadline = time.monotonic() + deadline_s
    while len(gateway.worker_pids()) < workers:
        if time.monotonic() > deadline:
            gateway.server.stop()
            raise RuntimeError(f"not all workers started:\n{gateway.server.log()}")
        time.sleep(0.05)


@pytest.fixture
async def http(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(
        base_url=gateway.url, timeout=30.0, limits=limits, trust_env=False
    ) as client:
        yield client


@pytest.fixture
async def upstream(suppliers: Server) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the supplier server (stats, faults), by tenant path."""
    async with httpx.AsyncClient(base_url=suppliers.url, timeout=10.0, trust_env=False) as client:
        yield client


def policy_dir_of(gateway: Gateway) -> Path:
    return Path(gateway.server.env["IRREV_POLICY_DIR"])
