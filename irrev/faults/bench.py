"""A bench: the processes one group of cells shares (a redis-server, the supplier,
gateway workers), and a run: one fresh tenant on that bench, with its own policy
file, agents and tokens, so that runs never see each other's holds, keys or
budgets.

A bench is built per `BenchSpec`; cells that need the same processes share it and
run one after the other, each run on its own tenant. Its Redis is an embedded
redis-server, or with `cluster` a local 3-primary + 3-replica Redis Cluster, so the
same promises are checked on the distributed engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from redis.asyncio import Redis, RedisCluster

from gateway.edge.wire import hold_id_for, upstream_key
from irrev.cli import CliError
from irrev.harness import PolicyDraft, at_exit, forget, free_port
from irrev.localcluster import LocalCluster
from ledger import AppendFsync, EmbeddedRedis, Ledger
from ledger.keys import hold_key, tenant_prefix

from .procs import GatewayProc, SupplierProc, start_supplier

ADMIN_NAME = "faults"
AGENTS = ("buyer-01", "buyer-02", "buyer-03", "buyer-04")
HOLD_TTL_S = 3
ORDER_ROUTE = "POST /orders"

# Limits in USD (major units); a plain order is 2 x 5 = 10, an escalated one 400. The
# order routes (ORDER_ROUTES, one pair per tool of TOOLS) come before the deploy route.
POLICY = PolicyDraft.parse("""\
tenant: set-per-run
risk_unit: {currency: USD, scale: 1000000}
window: 24h
soft_band: 0.8
escalation_ttl: 10m
hold_ttl: set-per-run
unknown_routes: deny
accounts:
  tenant: {limit: "1000"}
  principals:
    procurement: {limit: "900"}
  risk_factors:
    "supplier:*": {limit: "800"}
tools:
  supplier: {upstream: set-per-bench}
  flaky: {upstream: set-per-bench}
  closed: {upstream: set-per-bench}
  deploy: {}
routes:
  - tool: deploy
    route: POST /deploys
    class: irreversible
    face_value_fixed: "5"
    in_process: true
agents: {}
""")
ORDER_ROUTES = yaml.safe_load("""\
- tool: set-per-tool
  route: POST /orders
  class: irreversible
  body: [supplier_id, sku, quantity, unit_price]
  face_value: quantity * unit_price
  risk_factors: ["supplier:{supplier_id}"]
  approval_threshold: "300"
  lookup: GET /orders?idempotency_key={key}
- tool: set-per-tool
  route: GET /orders/{order_id}
  class: read
""")
AGENT = {"principal": "procurement", "per_effect_cap": "500", "window_cap": "5000"}
TOOLS = ("supplier", "flaky", "closed")


def order_routes(tool: str) -> list[dict[str, Any]]:
    """The order and lookup routes of the supplier API, as `tool`'s."""
    return [{**route, "tool": tool} for route in ORDER_ROUTES]


@dataclass(frozen=True)
class BenchSpec:
    """What processes a cell needs. Cells with equal specs share one bench."""

    gateways: int = 1
    appendfsync: str = "always"
    upstream_timeout_s: float = 1.0
    max_body_bytes: int = 65536


@dataclass(kw_only=True)
class Bench:
    spec: BenchSpec
    workdir: Path
    redis_server: EmbeddedRedis | LocalCluster
    supplier: SupplierProc
    gateways: list[GatewayProc]
    admin_token: str
    closed_port: int
    redis: Redis | RedisCluster
    ledger: Ledger
    http: httpx.AsyncClient
    # IRREV_* settings every gateway also runs with (`irrev faults --setting`).
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def policy_dir(self) -> Path:
        return self.workdir / "policies"

    def gateway_env(self) -> dict[str, str]:
        own = {
            "IRREV_REDIS_URL": self.redis_server.url,
            "IRREV_POLICY_DIR": str(self.policy_dir),
            "IRREV_ADMIN_TOKENS": f"{ADMIN_NAME}={self.admin_token}",
            "IRREV_UPSTREAM_TIMEOUT_S": str(self.spec.upstream_timeout_s),
            "IRREV_UPSTREAM_CONNECT_TIMEOUT_S": "1.0",
            "IRREV_FORWARD_MARGIN_S": "0.5",
            "IRREV_SWEEP_INTERVAL_S": "0.5",
            "IRREV_MAX_BODY_BYTES": str(self.spec.max_body_bytes),
            "IRREV_LOG_LEVEL": "warning",
        }
        if clash := sorted(self.settings.keys() & own.keys()):
            raise CliError(
                f"{', '.join(clash)}: set by the fault bench itself; --setting takes "
                "the gateway's other IRREV_* settings"
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("IRREV_")}
        return {**env, **own, **self.settings}

    async def start_gateway(self, index: int, crash_at: str = "") -> None:
        await asyncio.to_thread(self.gateways[index].start, crash_at)
        # A restarted gateway listens on its old port: a kept-alive connection to the
        # killed one would be reused and fail ("server disconnected"), so start afresh.
        stale, self.http = self.http, harness_client()
        await stale.aclose()

    async def disarm(self) -> None:
        """Restart, without a crash point, every gateway that has one armed."""
        for gateway in self.gateways:
            if gateway.crash_at:
                if gateway.alive:
                    await asyncio.to_thread(gateway.stop)
                await self.start_gateway(gateway.index)

    @property
    def embedded(self) -> EmbeddedRedis:
        """The bench's one redis-server, for cells that kill or restart it."""
        if not isinstance(self.redis_server, EmbeddedRedis):
            raise RuntimeError("this cell needs the one embedded redis-server, not a cluster")
        return self.redis_server

    async def restart_redis(self) -> None:
        """Start redis-server again if it is down; the harness's own connections to
        the dead server are dropped (the gateways must recover by themselves)."""
        if isinstance(self.redis_server, LocalCluster):
            return
        url = self.redis_server.url
        if await asyncio.to_thread(self.redis_server.ensure_running) != url:
            raise RuntimeError("redis-server came back on another port")
        assert isinstance(self.redis, Redis)
        await self.redis.connection_pool.disconnect()
        ledger_redis = self.ledger.redis
        assert isinstance(ledger_redis, Redis), "the fault bench runs on a standalone Redis"
        await ledger_redis.connection_pool.disconnect()

    async def kill_redis(self) -> None:
        await asyncio.to_thread(self.embedded.kill)

    @contextlib.asynccontextmanager
    async def run(self, label: str) -> AsyncIterator[Run]:
        await self.restart_redis()  # a no-op unless a failed run left it down
        for gateway in self.gateways:
            if not gateway.alive:
                await self.start_gateway(gateway.index, gateway.crash_at)
        run = Run(self, f"f-{label[:24]}-{uuid.uuid4().hex[:10]}".replace("_", "-"))
        await run.add_tenant(run.tenant)
        try:
            yield run
        finally:
            with contextlib.suppress(httpx.HTTPError):
                await run.behave()
            for tenant in run.tenants:
                (self.policy_dir / f"{tenant}.yaml").unlink(missing_ok=True)


def harness_client() -> httpx.AsyncClient:
    # Idle connections are dropped well before uvicorn's 5 s keep-alive closes them,
    # or a request can leave on a socket the server is closing at that moment.
    limits = httpx.Limits(max_connections=64, keepalive_expiry=1.0)
    return httpx.AsyncClient(timeout=30.0, trust_env=False, limits=limits)


@contextlib.asynccontextmanager
async def open_bench(
    spec: BenchSpec, cluster: bool = False, settings: Mapping[str, str] | None = None
) -> AsyncIterator[Bench]:
    """Start every process of the bench; stop all of them however the block ends.
    `settings`: IRREV_* settings every gateway runs with besides the bench's own."""
    workdir = Path(tempfile.mkdtemp(prefix="irrev-faults-"))
    (workdir / "policies").mkdir()
    redis_server: EmbeddedRedis | LocalCluster
    if cluster:
        redis_server = LocalCluster(cluster_binary(), workdir / "cluster")
    else:
        redis_server = EmbeddedRedis(
            workdir / "redis", appendfsync=AppendFsync(spec.appendfsync), tcp=True
        )
    supplier: SupplierProc | None = None
    gateways: list[GatewayProc] = []
    bench: Bench | None = None
    # Ended by SIGTERM, or by an exit this block's end never sees: the servers stop
    # (the harness's) and then the redis-server and the work directory go.
    exiting = at_exit(functools.partial(_remove, redis_server, workdir))
    try:
        await asyncio.to_thread(_start_redis, redis_server)
        supplier = await asyncio.to_thread(start_supplier, workdir)
        redis: Redis | RedisCluster
        if cluster:
            redis = RedisCluster.from_url(redis_server.url, decode_responses=False)
        else:
            redis = Redis.from_url(redis_server.url, decode_responses=False)
        bench = Bench(
            spec=spec,
            workdir=workdir,
            redis_server=redis_server,
            supplier=supplier,
            gateways=gateways,
            admin_token=secrets.token_urlsafe(24),
            closed_port=free_port(),
            redis=redis,
            ledger=Ledger.from_url(redis_server.url),
            http=harness_client(),
            settings=dict(settings or {}),
        )
        env = bench.gateway_env()
        gateways.extend(GatewayProc(i, free_port(), env, workdir) for i in range(spec.gateways))
        await asyncio.gather(*(bench.start_gateway(i) for i in range(spec.gateways)))
        try:
            yield bench
        finally:
            await redis.aclose()
            await bench.ledger.aclose()
    finally:
        if bench is not None:
            await bench.http.aclose()
        for gateway in gateways:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(gateway.stop)
        if supplier is not None:
            await asyncio.to_thread(supplier.server.stop)
        await asyncio.to_thread(_remove, redis_server, workdir)
        forget(exiting)


def _remove(redis_server: EmbeddedRedis | LocalCluster, workdir: Path) -> None:
    _stop_redis(redis_server)
    shutil.rmtree(workdir, ignore_errors=True)


def cluster_binary() -> Path:
    """The system's redis-server: Redis 7 (the embedded 6.2 has no `cluster-port`)."""
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(
            "a cluster bench needs Redis 7's redis-server and redis-cli on PATH "
            "(apt install redis-server)"
        )
    return Path(found)


def _start_redis(server: EmbeddedRedis | LocalCluster) -> None:
    if isinstance(server, LocalCluster):
        server.start()
    else:
        server.acquire()


def _stop_redis(server: EmbeddedRedis | LocalCluster) -> None:
    if isinstance(server, LocalCluster):
        server.stop()
        return
    with contextlib.suppress(Exception):
        server.ensure_running()
    server.release()


@dataclass
class Run:
    """One run: a fresh tenant (and more on demand) on a bench."""

    bench: Bench
    tenant: str
    tenants: list[str] = field(default_factory=list)
    tokens: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: dict[str, float] = field(default_factory=dict)

    # -- set-up ----------------------------------------------------------------

    async def add_tenant(self, tenant: str, hold_ttl_s: int = HOLD_TTL_S) -> None:
        """Write the tenant's policy and make every live gateway load it."""
        policy = POLICY.copy().named(tenant)
        policy.document["hold_ttl"] = f"{hold_ttl_s}s"
        policy.point(self.bench.supplier.url, ("supplier",))
        policy.point(self.bench.supplier.reset_url, ("flaky",))
        policy.point(f"http://127.0.0.1:{self.bench.closed_port}", ("closed",))
        policy.document["routes"][:0] = [r for tool in TOOLS for r in order_routes(tool)]
        for name in AGENTS:
            policy.add_agent(name, **AGENT)
        policy.write(self.bench.policy_dir)
        self.tenants.append(tenant)
        self.tokens[tenant] = policy.tokens
        await self.reload()

    async def reload(self) -> None:
        for gateway in self.bench.gateways:
            if gateway.alive:
                response = await self.admin("POST", "/v1/admin/policies/reload", gateway.index)
                if response.status_code != 200:
                    raise RuntimeError(f"policy reload failed: {response.text}")

    # -- requests --------------------------------------------------------------

    def url(self, gateway: int = 0) -> str:
        return self.bench.gateways[gateway].url

    def agent_headers(self, agent: str = "buyer-01", tenant: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[tenant or self.tenant][agent]}"}

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.bench.admin_token}"}

    async def admin(
        self, method: str, path: str, gateway: int = 0, **kwargs: Any
    ) -> httpx.Response:
        return await self.bench.http.request(
            method, self.url(gateway) + path, headers=self.admin_headers(), **kwargs
        )

    async def order(
        self,
        key: str,
        *,
        gateway: int = 0,
        tool: str = "supplier",
        quantity: int = 2,
        unit_price: int = 5,
        agent: str = "buyer-01",
        tenant: str | None = None,
        timeout_s: float = 30.0,
    ) -> httpx.Response:
        body = {"supplier_id": "s1", "sku": "bolts", "quantity": quantity, "unit_price": unit_price}
        headers = {**self.agent_headers(agent, tenant), "Idempotency-Key": key}
        return await self.bench.http.post(
            f"{self.url(gateway)}/tools/{tool}/orders",
            json=body,
            headers=headers,
            timeout=timeout_s,
        )

    def hold_id(
        self, key: str, *, tool: str = "supplier", agent: str = "buyer-01", tenant: str = ""
    ) -> str:
        return hold_id_for(tenant or self.tenant, agent, f"{tool} {ORDER_ROUTE}", key)

    async def faults(self, **faults: Any) -> None:
        response = await self.bench.http.post(f"{self.bench.supplier.url}/_faults", json=faults)
        response.raise_for_status()

    async def behave(self) -> None:
        await self.faults(times=0)

    async def supplier_stats(self) -> dict[str, Any]:
        response = await self.bench.http.get(f"{self.bench.supplier.url}/_stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    async def forwards(self, hold_id: str) -> int:
        """How many times the upstream was asked to make this hold's effect."""
        by_key: dict[str, int] = (await self.supplier_stats())["requests_by_key"]
        return by_key.get(upstream_key(hold_id), 0)

    async def wait_forwarded(self, hold_id: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while await self.forwards(hold_id) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the upstream never saw hold {hold_id}")
            await asyncio.sleep(0.01)

    async def reconcile(self, gateway: int = 0) -> dict[str, Any]:
        response = await self.admin("POST", f"/v1/admin/tenants/{self.tenant}/reconcile", gateway)
        if response.status_code != 200:
            raise RuntimeError(f"reconcile answered {response.status_code}: {response.text}")
        report: dict[str, Any] = response.json()
        return report

    # -- the store ----------------------------------------------------------------

    async def redis_now_ms(self) -> int:
        seconds, micros = await self.bench.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def wait_past_deadlines(self, tenant: str = "") -> None:
        """Until every live hold of the tenant is past its deadline, by Redis's clock."""
        tenant = tenant or self.tenant
        deadlines = [
            int(dl)
            for key in await self.hold_keys(tenant)
            if (dl := await self.bench.redis.hget(key, "dl")) is not None
        ]
        latest = max(deadlines, default=0)
        while await self.redis_now_ms() <= latest:
            await asyncio.sleep(0.05)

    async def hold_keys(self, tenant: str = "") -> list[bytes]:
        pattern = _glob(hold_key(tenant or self.tenant, "")) + "*"
        return sorted([k async for k in self.bench.redis.scan_iter(match=pattern, count=500)])

    async def hold_state(self, hold_id: str, tenant: str = "") -> str:
        state = await self.bench.redis.hget(hold_key(tenant or self.tenant, hold_id), "st")
        return state.decode() if isinstance(state, bytes) else (state or "")

    async def tenant_keys(self, tenant: str = "") -> list[bytes]:
        pattern = _glob(tenant_prefix(tenant or self.tenant)) + "*"
        return sorted([k async for k in self.bench.redis.scan_iter(match=pattern, count=500)])


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
