"""Stateless gateways: several `irrev serve` hosts on different loopback addresses
(Linux routes all of 127/8 to lo), one with its clock 3 s ahead (libfaketime), each
with its own, different copy of the tenant's policy file, on one Redis.

- limits never flip back: the fleet serves the policy store's version; a host's copy
  seen for the first time is recorded, not applied, and an edit of a copy writes
  only the fields it changed, over the store's newest version (before: the file
  with the latest mtime won whole, 250,000 -> 199,999 -> 188,888 -> 177,777 ->
  188,888 -> 199,999 USD);
- a token revoked through one host is refused by every host after a policy refresh,
  also while no host can subscribe to the store's announcements (pub/sub cut: the
  hosts read the store only every 600 s otherwise, so only the fallback can do it);
- the host whose clock is ahead forwards like the others (before, it measured the
  hold's Redis deadline against its own clock: every effect 503 hold_deadline), and
  no hold is voided by a reconciler while its forward is in flight;
- one sweeper per tenant at a time (a lease), counted from each host's /metrics.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from irrev.harness import PolicyDraft, new_token
from ledger.cluster import cluster_enabled
from pricing.credentials import hash_token

from .helpers import effect_headers, ledger_audit, order, set_faults, supplier_stats
from .servers import BIN, EXAMPLES, Server, Tenant, base_env

# libfaketime preloaded into the gateway itself: no wrapper process between the
# harness and the gateway it signals.
FAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)
# Slow (three gateways on three addresses): .ci/run runs it, README's test command does not.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        FAKETIME is None,
        reason="no libfaketime (apt-get install faketime): the fleet test runs one gateway "
        "with its clock 3 s ahead",
    ),
]
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SKEWED = "127.0.0.4"
# Each host's copy of the policy has its own tenant limit (USD), written in this order.
LIMITS = {"127.0.0.2": 3000, "127.0.0.3": 999, "127.0.0.4": 2000}
REFRESH_S = 2.0  # the default IRREV_POLICY_CHECK_INTERVAL_S
WAIT_S = 30.0
POLL_S = 600.0
CHANGES = "irrev:{fleet}:changes"


@dataclass
class Fleet:
    hosts: dict[str, Server]
    tenant: Tenant
    policy: PolicyDraft
    admin_token: str
    redis_url: str

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def start(self, host: str) -> None:
        self.hosts[host].start("/readyz")


def gateway_on(host: str, root: Path, env: dict[str, str]) -> Server:
    if host == SKEWED:
        env = {**env, "LD_PRELOAD": str(FAKETIME), "FAKETIME": "+3s"}
    server = Server(
        name=f"gateway {host}", argv=[], env=env, log_path=root / f"{host}.log", host=host
    )
    server.argv = [str(BIN / "irrev"), "serve", "--host", host]
    server.argv += ["--port", str(server.port), "--workers", "1"]
    return server


@pytest.fixture(scope="module")
def fleet(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    tenant_id = f"fleet-{secrets.token_hex(5)}"
    supplier_url = f"{suppliers.url}/{tenant_id}"
    policy = PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant_id).fresh_tokens()
    policy.point(supplier_url).fresh_settlers()
    # Long enough to forward within (1 s upstream timeout + 0.5 s margin + 1 s), short
    # enough that a clock 3 s ahead would have seen too little of it left.
    policy.document["hold_ttl"] = "4s"
    admin_token = secrets.token_urlsafe(24)
    hosts = {}
    for host in HOSTS:
        copy = policy.copy()
        copy.document["accounts"]["tenant"]["limit"] = str(LIMITS[host])
        copy.write(root / host)
        env = base_env(
            IRREV_REDIS_URL=redis_url,
            IRREV_POLICY_DIR=str(root / host),
            IRREV_ADMIN_TOKENS=f"ops={admin_token}",
            IRREV_UPSTREAM_TIMEOUT_S="1",
            IRREV_FORWARD_MARGIN_S="0.5",
            IRREV_SWEEP_INTERVAL_S=str(REFRESH_S),
            IRREV_POLICY_CHECK_INTERVAL_S=str(REFRESH_S),
            # Longer than any wait here: a host learns of a write by pub/sub, or by
            # reading the store while its subscription is down, not by its slow poll.
            IRREV_POLICY_POLL_S=str(POLL_S),
        )
        hosts[host] = gateway_on(host, root, env)
    tenant = Tenant(tenant_id, policy.tokens, supplier_url, policy.settlers)
    fleet = Fleet(hosts, tenant, policy, admin_token, redis_url)
    try:
        for host in HOSTS:
            fleet.start(host)
        yield fleet
    finally:
        for server in hosts.values():
            server.stop()


@pytest.fixture
async def clients(fleet: Fleet) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    opened = {
        host: httpx.AsyncClient(base_url=server.url, timeout=30.0, trust_env=False)
        for host, server in fleet.hosts.items()
    }
    try:
        yield opened
    finally:
        for client in opened.values():
            await client.aclose()


async def ledger_limit(client: httpx.AsyncClient, fleet: Fleet) -> int:
    response = await client.get(
        f"/v1/admin/tenants/{fleet.tenant.id}/balances", headers=fleet.admin
    )
    assert response.status_code == 200, response.text
    (limit,) = [row["limit"] for row in response.json() if row["account"].startswith("tenant:")]
    return int(limit)


async def served_limit(client: httpx.AsyncClient, fleet: Fleet) -> str:
    """The tenant account's limit in the policy the host serves, in micros."""
    response = await client.get(f"/v1/admin/tenants/{fleet.tenant.id}/policy", headers=fleet.admin)
    assert response.status_code == 200, response.text
    return str(response.json()["accounts"]["tenant"]["limit"])


def changes(values: list[int]) -> list[int]:
    """The values in the order they were seen, consecutive repeats dropped."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


async def test_limits_never_flip_back(fleet: Fleet, clients: dict[str, httpx.AsyncClient]) -> None:
    """Each host has its own copy of the policy; the oldest copy's host restarts twice
    meanwhile. The first host's copy went into the store; the others' copies, seen
    for the first time, were recorded, not applied, and being served to a restarted
    host changes nothing: the limit never moves, and every host serves one version."""
    seen = []
    probe = clients[HOSTS[1]]
    for round_ in range(3):
        for _ in range(4):  # a few refreshes of every host
            seen.append(await ledger_limit(probe, fleet))
            await asyncio.sleep(REFRESH_S / 2)
        if round_ < 2:
            old = fleet.hosts[HOSTS[0]]
            old.stop()
            seen.append(await ledger_limit(probe, fleet))
            fleet.start(HOSTS[0])
    assert changes(seen) == [LIMITS[HOSTS[0]] * 10**6], f"the limit moved: {changes(seen)}"
    await agree(fleet, clients)
    print(f"\nlimits seen in the ledger: {[v // 10**6 for v in changes(seen)]} USD")


async def agree(fleet: Fleet, clients: dict[str, httpx.AsyncClient], usd: int | None = None) -> str:
    """Until every host serves one version (with a tenant limit of `usd`, if given);
    its tenant limit, in micros."""
    deadline = time.monotonic() + WAIT_S
    while True:
        served = {await served_limit(c, fleet) for c in clients.values()}
        if len(served) == 1 and (usd is None or served == {str(usd * 10**6)}):
            return served.pop()
        assert time.monotonic() < deadline, f"the hosts never agreed on one version: {served}"
        await asyncio.sleep(0.05)


def edit_copy(fleet: Fleet, host: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit `host`'s own copy of the policy in place, as a person would."""
    env = fleet.hosts[host].env
    assert env is not None  # gateway_on gives every host its own
    path = env["IRREV_POLICY_DIR"] + f"/{fleet.tenant.id}.yaml"
    document = yaml.safe_load(Path(path).read_text())
    change(document)
    temporary = Path(path + ".tmp")
    temporary.write_text(yaml.safe_dump(document, sort_keys=False))
    temporary.replace(path)


async def test_an_edit_of_a_stale_copy_never_brings_an_older_limit_back(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Issue 30's sequence: C (the host 3 s ahead) edits the tenant limit in its copy,
    1 s later A edits it in its own, then B revokes a token by editing its copy,
    which still holds its old limit. Before, the file with the latest mtime won
    whole: C's older edit came back, then B's old limit. Each edit is what changed
    in its file since its host read it, written over the store's newest version:
    the limit only moves to the newer edit, and the token is refused by every host
    (announced: within one refresh interval)."""
    agent = "buyer-05"
    a, b, c = HOSTS[0], HOSTS[1], SKEWED
    probe = clients[b]
    for client in clients.values():
        ok = await client.get("/tools/supplier/catalog", headers=fleet.tenant.auth(agent))
        assert ok.status_code == 200, ok.text
    seen: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            seen.append(await ledger_limit(probe, fleet))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        edit_copy(fleet, c, lambda d: d["accounts"]["tenant"].update(limit="188888"))
        await asyncio.sleep(1.0)
        edit_copy(fleet, a, lambda d: d["accounts"]["tenant"].update(limit="177777"))
        await agree(fleet, clients, 177_777)
        edit_copy(fleet, b, lambda d: d["agents"][agent].update(token_sha256=hash_token("x")))
        took = await refused_everywhere(fleet, clients, agent)
        await asyncio.sleep(3 * REFRESH_S)  # every host refreshes a few times more
    finally:
        stop.set()
        await watcher
    history = [v // 10**6 for v in changes(seen)]
    assert history in ([LIMITS[a], 188_888, 177_777], [LIMITS[a], 177_777]), history
    assert int(await agree(fleet, clients)) == 177_777 * 10**6
    print(
        f"\nlimits seen in the ledger: {history} USD; token refused after (s, refresh "
        f"every {REFRESH_S} s): {took}"
    )


async def test_a_revoked_token_is_refused_by_every_host(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient]
) -> None:
    agent = "buyer-02"
    for client in clients.values():
        ok = await client.get("/tools/supplier/catalog", headers=fleet.tenant.auth(agent))
        assert ok.status_code == 200, ok.text
    await revoke(fleet, clients[HOSTS[0]], agent)
    took = await refused_everywhere(fleet, clients, agent)
    for client in clients.values():  # and it stays refused
        again = await client.get("/tools/supplier/catalog", headers=fleet.tenant.auth(agent))
        assert again.status_code == 401
    print(f"\nrevocation refused after (s, refresh every {REFRESH_S} s): {took}")


async def revoke(fleet: Fleet, client: httpx.AsyncClient, agent: str) -> None:
    """Upload, through `client`'s host, the policy it serves with `agent`'s token
    replaced, made from the version it serves (its ETag)."""
    url = f"/v1/admin/tenants/{fleet.tenant.id}/policy"
    current = await client.get(url, headers={**fleet.admin, "Accept": "application/yaml"})
    assert current.status_code == 200, current.text
    document = yaml.safe_load(current.text)
    document["agents"][agent]["token_sha256"] = hash_token(new_token())
    response = await client.put(
        url,
        content=yaml.safe_dump(document, sort_keys=False),
        headers={**fleet.admin, "If-Match": current.headers["etag"]},
    )
    assert response.status_code == 200, response.text


async def refused_everywhere(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient], agent: str
) -> dict[str, float]:
    """Seconds until each host refused `agent`'s token (it stays refused)."""
    since = time.monotonic()
    took = {}
    for host, client in clients.items():
        while (
            await client.get("/tools/supplier/catalog", headers=fleet.tenant.auth(agent))
        ).status_code != 401:
            assert time.monotonic() - since < WAIT_S, f"{host} still accepts the token"
            await asyncio.sleep(0.02)
        took[host] = round(time.monotonic() - since, 2)
    return took


def redis_nodes(url: str) -> list[redis.Redis]:
    """A client of each node (one for a standalone Redis): pub/sub is per node."""
    if not cluster_enabled(url):
        return [redis.Redis.from_url(url, decode_responses=True)]
    cluster = redis.RedisCluster.from_url(url, decode_responses=True)
    return [
        redis.Redis(host=node.host, port=node.port, decode_responses=True)
        for node in cluster.get_nodes()
    ]


def subscribers(nodes: list[redis.Redis]) -> int:
    return sum(int(node.execute_command("PUBSUB", "NUMSUB", CHANGES)[1]) for node in nodes)


async def all_subscribed(nodes: list[redis.Redis], failure: str) -> None:
    """Wait until every host listens to the change feed."""
    deadline = time.monotonic() + WAIT_S
    while subscribers(nodes) < len(HOSTS):
        assert time.monotonic() < deadline, failure
        await asyncio.sleep(0.05)


async def test_a_token_revoked_while_pub_sub_is_cut_is_refused_by_every_host(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Every host's subscription killed (CLIENT KILL TYPE pubsub) and SUBSCRIBE
    refused until the end, so the announcement of the upload reaches nobody: every
    host still refuses the revoked token (it reads the store every refresh while it
    is not subscribed), then subscribes again and hears the next revocation."""
    nodes = redis_nodes(fleet.redis_url)
    for agent in ("buyer-03", "buyer-04"):
        for client in clients.values():
            ok = await client.get("/tools/supplier/catalog", headers=fleet.tenant.auth(agent))
            assert ok.status_code == 200, ok.text
    await all_subscribed(nodes, "not every host subscribed")
    try:
        for node in nodes:
            node.execute_command("ACL", "SETUSER", "default", "-subscribe")
            node.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        assert subscribers(nodes) == 0
        await revoke(fleet, clients[HOSTS[0]], "buyer-03")
        cut = await refused_everywhere(fleet, clients, "buyer-03")
    finally:
        for node in nodes:
            node.execute_command("ACL", "SETUSER", "default", "+subscribe")
    await all_subscribed(nodes, "a host never subscribed again")
    await revoke(fleet, clients[HOSTS[1]], "buyer-04")
    heard = await refused_everywhere(fleet, clients, "buyer-04")
    print(f"\nrevocation refused after (s), pub/sub cut: {cut}; subscribed again: {heard}")


async def test_every_host_forwards_and_no_hold_is_voided_in_flight(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient], upstream: httpx.AsyncClient
) -> None:
    """Orders through every host (the one 3 s ahead too) to an upstream that answers
    late, while the other hosts reconcile the tenant again and again: each order is
    made once, posted, and no hold is voided."""
    await set_faults(upstream, fleet.tenant, delay_s=0.35)
    stop = asyncio.Event()

    async def reconcile(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            response = await client.post(
                f"/v1/admin/tenants/{fleet.tenant.id}/reconcile", headers=fleet.admin
            )
            assert response.status_code == 200, response.text
            assert not response.json()["voided"], response.text
            await asyncio.sleep(0.05)

    async def orders(host: str, client: httpx.AsyncClient) -> list[int]:
        statuses = []
        for i in range(4):
            response = await client.post(
                "/tools/supplier/orders",
                json=order(quantity=1, unit_price="5"),
                headers=effect_headers(fleet.tenant, "buyer-01", f"{host}-{i}"),
            )
            statuses.append(response.status_code)
        return statuses

    reconcilers = [asyncio.create_task(reconcile(clients[h])) for h in HOSTS if h != SKEWED]
    try:
        results = await asyncio.gather(*(orders(h, c) for h, c in clients.items()))
    finally:
        stop.set()
        await asyncio.gather(*reconcilers)
        await set_faults(upstream, fleet.tenant, delay_s=0.0)
    assert all(status == 201 for statuses in results for status in statuses), results
    stats = await supplier_stats(upstream, fleet.tenant)
    assert stats["orders"] == 4 * len(HOSTS), stats
    voided = await clients[HOSTS[0]].get(
        f"/v1/admin/tenants/{fleet.tenant.id}/holds",
        params={"state": "voided"},
        headers=fleet.admin,
    )
    assert voided.json() == [], voided.text
    audit = ledger_audit(fleet.redis_url, fleet.tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


SWEEPS = re.compile(r'^irrev_sweeps_total\{tenant="([^"]+)"\} ([0-9.e+]+)$', re.MULTILINE)


async def sweeps(client: httpx.AsyncClient, fleet: Fleet) -> float:
    text = (await client.get("/metrics", headers=fleet.admin)).text
    return sum(float(n) for tenant, n in SWEEPS.findall(text) if tenant == fleet.tenant.id)


async def test_one_host_sweeps_the_tenant(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Between two scrapes several sweep intervals apart, one host's count of the
    tenant's sweeps grew and no other's did."""
    before = {host: await sweeps(c, fleet) for host, c in clients.items()}
    deadline = time.monotonic() + WAIT_S
    while True:
        after = {host: await sweeps(c, fleet) for host, c in clients.items()}
        grown = {host for host in HOSTS if after[host] > before[host]}
        if sum(after.values()) - sum(before.values()) >= 4:
            break
        assert time.monotonic() < deadline, f"no sweeps: {before} -> {after}"
        await asyncio.sleep(REFRESH_S)
    assert len(grown) == 1, f"several hosts swept the tenant: {before} -> {after}"


async def test_fleet_gauges_come_from_one_host(
    fleet: Fleet, clients: dict[str, httpx.AsyncClient]
) -> None:
    """A tenant's budgets and live holds are the fleet's (read from Redis): one host
    reports them, so summing over instances counts them once; every host reports its
    own counters and policy version."""
    reporting, versions = set(), set()
    for host, client in clients.items():
        text = (await client.get("/metrics", headers=fleet.admin)).text
        if f'irrev_budget_limit_micros{{account="tenant:{fleet.tenant.id}"' in text or re.search(
            rf'irrev_budget_limit_micros\{{[^}}]*tenant="{fleet.tenant.id}"', text
        ):
            reporting.add(host)
        if re.search(rf'irrev_policy_info\{{[^}}]*tenant="{fleet.tenant.id}"', text):
            versions.add(host)
    assert len(reporting) == 1, reporting
    assert versions == set(HOSTS)
