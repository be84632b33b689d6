"""Gateway fixtures: one supplier server for the session, and per Redis server one
`irrev serve --workers 2`, whose tenants the test modules declare themselves.

A module that needs a tenant of the shared gateway declares it next to its tests,
with `new_tenant` (a copy of an example policy under a fresh id, fresh tokens and
its own supplier path, top-level keys replaced as given):

    @pytest.fixture(scope="module")
    def shop(new_tenant: TenantMaker) -> Tenant:
        return new_tenant("shop", accounts=example_accounts(tenant={"limit": "1"}))

The policy file is written into the running gateway's policy directory, which every
worker looks at every 0.25 s (FILE_LOOK_S), and `new_tenant` returns once every
worker of the gateway and of its peer has applied it: its balances, holds and
supplier counts are the module's own. When the module's tests are done its files are
removed, so the gateway serves only the tenants of the module running: a reload
(each new tenant's, each policy upload's) parses every policy file in the directory,
~50 ms of CPU each, which with every module's tenants piled up made reloads cost
seconds. Variants of the example that several modules use are in
tests/gateway/procurement.py.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import pytest

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

from .servers import (
    BIN,
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
# How long a new tenant may take to be applied by every worker (a look every 0.25 s,
# then a reload of the directory; minutes only on a machine that is badly overloaded).
TENANT_APPLIED_S = 60.0
# How long a test's client keeps an idle connection: well under the servers' keep-alive
# (uvicorn's 5 s, the gateway's and the suppliers'), which closes it at the server's
# end. httpx kept it 5 s too, so a request after a wait of about that long (a hold's
# deadline) could leave on a connection the server was closing, and fail to read
# (httpx.ReadError) whatever the server would have answered; on a loaded machine
# the client reads an answer, and starts its 5 s, later than the server sent it.
KEEP_ALIVE_S = 1.0

# The URLs of live peer gateways of the session's gateway (`peer_gateway`): a tenant's
# fleet gauges come from whichever gateway holds its sweep lease, so a scrape of the
# fleet reads them all (helpers.scrape_fleet, helpers.scrape_hosts).
PEERS: list[str] = []


class TenantMaker(Protocol):
    """`new_tenant`: a tenant, copied from examples/<example>.yaml, that the gateway
    serves by the time it is returned."""

    def __call__(self, name: str, example: str = "procurement", /, **overrides: Any) -> Tenant: ...


@dataclass
class Gateway:
    server: Server
    redis_url: str
    admin_token: str
    tenants: dict[str, Tenant] = field(default_factory=dict)
    # Where the supplier server is (its path /<tenant id> is a tenant's supplier): set
    # for the gateways of these fixtures, which `new_tenant` needs.
    suppliers_url: str = ""
    # Other `irrev serve`s on the same policy directory, which a new tenant must reach too.
    peers: list[Gateway] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    @property
    def env(self) -> dict[str, str]:
        """The environment `irrev serve` runs with (its IRREV_* settings)."""
        assert self.server.env is not None, "a gateway is started with its own environment"
        return self.server.env

    @property
    def policy_dir(self) -> Path:
        return Path(self.env["IRREV_POLICY_DIR"])

    def tenant(self, name: str) -> Tenant:
        return self.tenants[name]

    def new_tenant(self, name: str, example: str = "procurement", /, **overrides: Any) -> Tenant:
        """A copy of examples/<example>.yaml under a fresh id `<name>-<hex>`, with fresh
        tokens, its tools sent to the supplier server's /<tenant id> and top-level keys
        replaced by `overrides`; written into the policy directory and applied by
        every worker (this gateway's and its peers') before it is returned."""
        assert self.suppliers_url, "a gateway of own_gateway or the session's"
        tenant_id = f"{name}-{secrets.token_hex(5)}"
        supplier = f"{self.suppliers_url}/{tenant_id}"
        tenant = write_policy(self.policy_dir, example, tenant_id, supplier, **overrides)
        for host in (self, *self.peers):
            host.wait_applied(tenant_id)
        return tenant

    def remove_tenant(self, tenant: Tenant) -> None:
        """Its policy file gone: the gateway stops serving it (what Redis holds of it
        stays)."""
        (self.policy_dir / f"{tenant.id}.yaml").unlink(missing_ok=True)

    def wait_applied(self, tenant_id: str, deadline_s: float = TENANT_APPLIED_S) -> None:
        """Every live worker has applied a policy of `tenant_id` (it logs "policy
        applied" when its tenant's version in force changes, a worker started later
        at its first load); a file it did not apply fails at once, with why."""
        deadline = time.monotonic() + deadline_s
        while True:
            applied: set[int] = set()
            for entry in self.log_entries(tenant_id):
                if entry.get("tenant") != tenant_id:
                    continue
                if entry.get("msg") == "policy applied":
                    applied.add(int(entry["pid"]))
                elif entry.get("msg") == "policy not applied":
                    raise AssertionError(f"{tenant_id} was not applied: {entry['problems']}")
            if {pid for pid in self.worker_pids() if _alive(pid)} <= applied:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{tenant_id} not applied by every worker:\n{self.server.log()}"
                )
            time.sleep(0.05)

    def worker_pids(self) -> set[int]:
        """Workers that logged "gateway ready" (JSON lines from every worker)."""
        return {
            int(e["pid"])
            for e in self.log_entries("gateway ready")
            if e.get("msg") == "gateway ready"
        }

    def log_entries(self, containing: str = "") -> list[dict[str, Any]]:
        """The workers' JSON log lines so far (those whose text contains `containing`)."""
        entries = []
        for line in self.log_text().splitlines():
            if line.startswith("{") and containing in line:
                entries.append(json.loads(line))
        return entries

    def log_text(self) -> str:
        """Everything its workers logged so far."""
        assert self.server.log_path is not None, "a gateway logs to a file"
        return self.server.log_path.read_text(errors="replace")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def suppliers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_suppliers(tmp_path_factory.mktemp("suppliers"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The session's gateway: it starts with no tenant; modules add theirs with
    `new_tenant`."""
    root = tmp_path_factory.mktemp("gateway")
    policy_dir = root / "policies"
    policy_dir.mkdir()
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
    gateway = Gateway(server, redis_url, admin_token, suppliers_url=suppliers.url)
    wait_for_workers(gateway)
    yield gateway
    server.stop()


@pytest.fixture(scope="module")
def new_tenant(gateway: Gateway) -> Iterator[TenantMaker]:
    """Tenants of the session's gateway (`Gateway.new_tenant`) for the module's tests,
    which the module declares in fixtures of its own (module-scoped: its tests share
    them); served until the module is done."""
    made: list[Tenant] = []

    def make(name: str, example: str = "procurement", /, **overrides: Any) -> Tenant:
        tenant = gateway.new_tenant(name, example, **overrides)
        made.append(tenant)
        return tenant

    yield make
    for tenant in made:
        gateway.remove_tenant(tenant)


@pytest.fixture(scope="module")
def peer_gateway(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A second, independent `irrev serve` on the same Redis and policies: which worker
    of one server accepts a connection is the kernel's choice, so a test that needs
    effects admitted by several processes for certain sends to both servers. Only for
    the module that asks: while it runs it takes tenants' sweep leases, and with them
    their fleet gauges, from the session's gateway. It runs with group commit
    (IRREV_GROUP_WAIT_MS, ledger/group.py), so the modules' promises hold with a
    gateway that groups its concurrent reserves and posts beside one that does not."""
    root = tmp_path_factory.mktemp("peer-gateway")
    server = Server(
        name="peer gateway",
        argv=[str(BIN / "irrev"), "serve"],
        env={**gateway.env, "IRREV_GROUP_WAIT_MS": "1"},
        log_path=root / "gateway.log",
    )
    server.argv += ["--port", str(server.port), "--workers", "1"]
    server.start("/readyz")
    peer = Gateway(
        server, gateway.redis_url, gateway.admin_token, suppliers_url=gateway.suppliers_url
    )
    wait_for_workers(peer, workers=1)
    PEERS.append(server.url)
    gateway.peers.append(peer)
    yield peer
    gateway.peers.remove(peer)
    PEERS.remove(server.url)
    server.stop()


@contextmanager
def own_gateway(
    redis_url: str,
    suppliers: Server,
    root: Path,
    workers: int,
    policy: dict[str, Any] | None = None,
    /,
    **settings: str,
) -> Iterator[Gateway]:
    """A gateway of its own, with extra IRREV_* settings, serving one fresh tenant
    (`.tenant("own")`, the procurement example with `policy`'s top-level keys
    replaced), for tests whose settings would disturb the shared gateway; more with
    its `new_tenant`. The arguments before the settings are positional, so that a
    dict of settings (`**settings`) can fill nothing but the settings."""
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
        gateway = Gateway(server, redis_url, admin_token, {"own": tenant}, suppliers.url)
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
    limits = httpx.Limits(
        max_connections=200, max_keepalive_connections=200, keepalive_expiry=KEEP_ALIVE_S
    )
    async with httpx.AsyncClient(
        base_url=gateway.url, timeout=30.0, limits=limits, trust_env=False
    ) as client:
        yield client


@pytest.fixture
async def upstream(suppliers: Server) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the supplier server (stats, faults), by tenant path."""
    limits = httpx.Limits(keepalive_expiry=KEEP_ALIVE_S)
    async with httpx.AsyncClient(
        base_url=suppliers.url, timeout=10.0, limits=limits, trust_env=False
    ) as client:
        yield client


def policy_dir_of(gateway: Gateway) -> Path:
    return gateway.policy_dir


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chrome]:
    """A headless Chromium for a module of the console's tests (console_page.py,
    imported here only when one asks for it: it imports this module)."""
    from .console_page import start_browser

    driver = start_browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a console test's screenshots go (console_page.artifacts_folder)."""
    from .console_page import artifacts_folder

    return artifacts_folder(request, tmp_path)
