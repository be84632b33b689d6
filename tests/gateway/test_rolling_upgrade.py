"""A rolling upgrade: the previous release (the last landed main, PREVIOUS, built from
git into a venv of its own) and this tree serve one Redis at once, behind one "load
balancer" (the test sends each request to one of them), under traffic: orders with
idempotency keys, each repeated on the other release, escalations raised on one
release and approved or rejected on the other. Then the old gateway is stopped while
the new one goes on, and the fleet is declared upgraded (`irrev ledger upgrade
finish`). Checked: no effect refused that should have been admitted (every order 201,
every repeat the same order, every decision answered as made), no double effect (the
supplier made each admitted key's order once), the ledger audit clean (balances equal
the journal's replay, escalation counts equal the escalations waiting).

docs/operations.md, "Rolling upgrades", says what holds during the mixed window."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from irrev.harness import PolicyDraft
from ledger.embedded import EmbeddedRedis
from ledger.release import FORMAT

from .helpers import ledger_audit, order, supplier_stats
from .servers import BIN, EXAMPLES, ROOT, Server, Tenant, base_env

pytestmark = pytest.mark.slow

# The previous release: the last commit landed on main before rolling upgrades.
PREVIOUS = "a2ce016"
AGENTS = tuple(f"buyer-{i:02d}" for i in range(1, 7))
# Orders per phase: while both releases serve, and after the old one stopped.
MIXED_ORDERS = 96
AFTER_ORDERS = 32
# Every ESCALATE_EVERY-th order is above the route's approval threshold (odd, so that
# both releases raise some).
ESCALATE_EVERY = 5
CONCURRENCY = 8
BIG = order(quantity=1, unit_price="100000")  # priced above the 30,000 USD threshold
LARGE = "10000000"
WAIT_S = 30.0  # USD: no limit binds, so every refusal would be a fault


@dataclass
class Release:
    """One gateway: the release it runs and its server."""

    name: str
    server: Server
    client: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        assert self.client is not None
        return self.client


@dataclass
class Traffic:
    """What was sent and answered: each key's first answer (its order id or its
    escalation), and every answer that was not what the key had to get."""

    tenant: Tenant
    admin: dict[str, str]
    orders: dict[str, str] = field(default_factory=dict)  # key -> order id
    escalations: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (id, agent)
    decided: dict[str, str] = field(default_factory=dict)  # key -> approved | rejected
    faults: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)

    def fault(self, what: str, response: httpx.Response) -> None:
        self.faults.append(f"{what}: {response.status_code} {response.text[:300]}")


def previous_irrev() -> Path:
    """`irrev` of the previous release, built once per commit into out/ (a venv with
    the release installed from `git archive`, not editable: nothing of this tree on
    its path)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--verify", f"{PREVIOUS}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        missing = f"the previous release {PREVIOUS} is not in this clone's history"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the rolling upgrade: {missing}", pytrace=False)
        pytest.skip(missing)
    home = ROOT / "out" / "previous-release" / commit
    irrev, done = home / "venv" / "bin" / "irrev", home / "built"
    if done.exists():
        return irrev
    shutil.rmtree(home, ignore_errors=True)
    source = home / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run(["python3", "-m", "venv", str(home / "venv")], check=True)
    pip = [str(home / "venv" / "bin" / "pip"), "install", "-q", str(source)]
    subprocess.run(pip, check=True, timeout=600)
    done.write_text(commit + "\n")
    return irrev


@pytest.fixture(scope="module")
def redis_url(redis_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of this test's own: the fleet's release flag is fleet-wide."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis"), binary=redis_binary, tcp=True) as server:
        yield server.url


def gateway_env(redis_url: str, policy_dir: Path, admin_token: str) -> dict[str, str]:
    return base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policy_dir),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        IRREV_UPSTREAM_TIMEOUT_S="5",
        IRREV_SWEEP_INTERVAL_S="0.5",
    )


def the_policy(tenant_id: str, supplier_url: str) -> PolicyDraft:
    """The procurement example (unchanged since PREVIOUS, so both releases read it)
    with limits no test traffic reaches."""
    policy = PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant_id).fresh_tokens()
    policy.point(supplier_url).fresh_settlers()
    accounts = policy.document["accounts"]
    accounts["tenant"]["limit"] = LARGE
    accounts["principals"]["procurement"]["limit"] = LARGE
    accounts["risk_factors"]["supplier:*"]["limit"] = LARGE
    del accounts["risk_factors"]["supplier:acme-steel"]
    for agent in policy.document["agents"].values():
        agent["per_effect_cap"] = agent["window_cap"] = LARGE
    return policy


async def send(
    release: Release, traffic: Traffic, agent: str, key: str, body: dict[str, Any]
) -> httpx.Response:
    headers = {**traffic.tenant.auth(agent), "Idempotency-Key": key}
    response = await release.http.post("/tools/supplier/orders", json=body, headers=headers)
    traffic.statuses[response.status_code] += 1
    return response


async def first_and_repeat(
    first: Release, second: Release, traffic: Traffic, index: int, prefix: str
) -> None:
    """Order `index`: sent to `first`, then its key repeated on `second`, which must
    answer the same (the order made, or the same escalation)."""
    key = f"{prefix}-{index}-{secrets.token_hex(4)}"
    agent = agent_of(key)
    big = index % ESCALATE_EVERY == 0
    body = BIG if big else order(quantity=1, unit_price="10")
    response = await send(first, traffic, agent, key, body)
    if big:
        if response.status_code != 202:
            traffic.fault(f"{first.name} escalation {key}", response)
            return
        traffic.escalations[key] = (response.json()["escalation"], agent)
    elif response.status_code != 201:
        traffic.fault(f"{first.name} order {key}", response)
        return
    else:
        traffic.orders[key] = response.json()["order_id"]
    again = await send(second, traffic, agent, key, body)
    if big:
        escalation = traffic.escalations[key][0]
        if again.status_code != 202 or again.json().get("escalation") != escalation:
            traffic.fault(f"{second.name} repeat of escalation {key}", again)
    elif again.status_code != 201 or again.json().get("order_id") != traffic.orders[key]:
        traffic.fault(f"{second.name} repeat of order {key}", again)


async def decide(release: Release, traffic: Traffic, key: str, verdict: str) -> None:
    escalation, _ = traffic.escalations[key]
    url = f"/v1/escalations/{escalation}/{verdict}"
    response = await release.http.post(url, headers=traffic.admin, json={"reason": "test"})
    traffic.statuses[response.status_code] += 1
    # An approval answers with the tool's answer (the order), a rejection with itself.
    made = response.status_code == 201 and "order_id" in response.json()
    if not (made if verdict == "approve" else response.status_code == 200):
        traffic.fault(f"{release.name} {verdict} {key}", response)
        return
    traffic.decided[key] = verdict
    if verdict == "approve":
        traffic.orders[key] = response.json()["order_id"]


async def repeat_all(release: Release, traffic: Traffic) -> None:
    """Every key sent so far, again: each gets what it got, or what was decided."""

    async def one(key: str, agent: str, body: dict[str, Any]) -> None:
        response = await send(release, traffic, agent, key, body)
        verdict = traffic.decided.get(key)
        if key in traffic.escalations and verdict is None:
            ok = response.status_code == 202
        elif verdict == "rejected":
            ok = response.status_code == 403 and response.json()["reason"] == "escalation_rejected"
        else:
            ok = response.status_code == 201 and response.json()["order_id"] == traffic.orders[key]
        if not ok:
            traffic.fault(f"{release.name} late repeat of {key}", response)

    small = order(quantity=1, unit_price="10")
    keys = set(traffic.orders) | set(traffic.escalations)
    await bounded(
        [one(key, agent_of(key), BIG if key in traffic.escalations else small) for key in keys]
    )


def agent_of(key: str) -> str:
    """The agent that sends key `<phase>-<index>-<random>`."""
    return AGENTS[int(key.split("-")[1]) % len(AGENTS)]


async def bounded(jobs: list[Any]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(job: Any) -> None:
        async with gate:
            await job

    await asyncio.gather(*(run(job) for job in jobs))


def release_format(redis_url: str) -> dict[str, Any]:
    shown = irrev_ledger(redis_url, "upgrade", "status", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return dict(json.loads(shown.stdout))


def counted_escalations(redis_url: str, tenant: Tenant) -> int:
    """The escalations waiting that the tenant's agent accounts count (reserve.lua)."""
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        fields = client.hscan_iter(f"irrev:{{{tenant.id}}}:accounts", match="*|esc")
        return sum(int(value) for _, value in fields)


def irrev_ledger(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "irrev"), "ledger", *args],
        env=base_env(IRREV_REDIS_URL=redis_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_old_and_new_serve_one_redis_then_the_old_stops(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    old_irrev = previous_irrev()
    tenant_id = f"upgrade-{secrets.token_hex(5)}"
    supplier_url = f"{suppliers.url}/{tenant_id}"
    policy = the_policy(tenant_id, supplier_url)
    admin_token = secrets.token_urlsafe(24)
    tenant = Tenant(tenant_id, policy.tokens, supplier_url, policy.settlers)
    traffic = Traffic(tenant, {"Authorization": f"Bearer {admin_token}"})

    # Each host its own copy of the policy, as hosts have; the old release runs from
    # outside this tree with nothing of it on its path.
    old_env = gateway_env(redis_url, tmp_path / "old-policies", admin_token)
    old_env.pop("PYTHONPATH", None)
    old_server = Server(
        name="old gateway", argv=[], env=old_env, log_path=tmp_path / "old.log", host="127.0.0.2"
    )
    old_server.cwd = tmp_path
    old_server.argv = [str(old_irrev), "serve", "--host", "127.0.0.2"]
    old_server.argv += ["--port", str(old_server.port), "--workers", "1"]
    new_env = gateway_env(redis_url, tmp_path / "new-policies", admin_token)
    new_server = Server(
        name="new gateway", argv=[], env=new_env, log_path=tmp_path / "new.log", host="127.0.0.3"
    )
    new_server.argv = [str(BIN / "irrev"), "serve", "--host", "127.0.0.3"]
    new_server.argv += ["--port", str(new_server.port), "--workers", "1"]
    old, new = Release("old", old_server), Release("new", new_server)
    policy.write(tmp_path / "old-policies")
    policy.write(tmp_path / "new-policies")
    try:
        # The fleet as it was (the old release), then the first new host joins it.
        old_server.start("/readyz")
        new_server.start("/readyz")
        # The store an older release served, without the flag: the new host decided
        # it is a rolling upgrade.
        assert release_format(redis_url) == {"format": 1, "was": 1, "state": "rolling upgrade"}
        async with (
            httpx.AsyncClient(base_url=old_server.url, timeout=30, trust_env=False) as old_http,
            httpx.AsyncClient(base_url=new_server.url, timeout=30, trust_env=False) as new_http,
            httpx.AsyncClient(base_url=suppliers.url, timeout=30, trust_env=False) as upstream,
        ):
            old.client, new.client = old_http, new_http
            # Both releases at once: each order on one, its repeat on the other.
            await bounded(
                [
                    first_and_repeat(*((old, new) if i % 2 else (new, old)), traffic, i, "mixed")
                    for i in range(MIXED_ORDERS)
                ]
            )
            # Escalations decided on the other release than the one that raised
            # them (odd indexes were raised on the old one); the last few wait.
            raised = list(traffic.escalations)
            waiting = raised[-4:]
            decisions = []
            for n, key in enumerate(raised[:-4]):
                on_old = int(key.split("-")[1]) % 2 == 0
                verdict = "reject" if n % 4 == 3 else "approve"
                decisions.append(decide(old if on_old else new, traffic, key, verdict))
            await bounded(decisions)
            traffic.decided = {
                k: ("rejected" if v == "reject" else "approved") for k, v in traffic.decided.items()
            }
            await repeat_all(old, traffic)

            # The old host leaves (a rolling restart's stop), the new one goes on.
            old_server.stop()
            await repeat_all(new, traffic)
            await bounded(
                [first_and_repeat(new, new, traffic, i, "after") for i in range(AFTER_ORDERS)]
            )
            for key in waiting:
                await decide(new, traffic, key, "approve")
                traffic.decided[key] = "approved"

            # No escalation raised while both served was counted.
            assert counted_escalations(redis_url, tenant) == 0
            finished = irrev_ledger(redis_url, "upgrade", "finish", "--json")
            assert finished.returncode == 0, finished.stdout + finished.stderr
            upgraded = {"format": FORMAT, "was": FORMAT, "state": "upgraded"}
            assert release_format(redis_url) == upgraded
            # Fully upgraded: the new host counts escalations again once it has read
            # the flag (every RELEASE_CHECK_S); each one raised meanwhile is approved.
            deadline = asyncio.get_running_loop().time() + WAIT_S
            counted = 0
            while counted == 0 and asyncio.get_running_loop().time() < deadline:
                index = ESCALATE_EVERY * len(traffic.escalations)
                await first_and_repeat(new, new, traffic, index, "finished")
                counted = counted_escalations(redis_url, tenant)
                if counted == 0:
                    await asyncio.sleep(0.5)
                for key in [k for k in traffic.escalations if k not in traffic.decided]:
                    await decide(new, traffic, key, "approve")
                    traffic.decided[key] = "approved"
            assert counted == 1
            assert counted_escalations(redis_url, tenant) == 0
            await repeat_all(new, traffic)

            stats = await supplier_stats(upstream, tenant)
        audit = ledger_audit(redis_url, tenant)
    finally:
        old_server.stop()
        new_server.stop()

    print(
        f"rolling upgrade: {sum(traffic.statuses.values())} requests {dict(traffic.statuses)}, "
        f"{len(traffic.orders)} keys admitted, {len(traffic.escalations)} escalated, "
        f"supplier orders {stats['orders']}, faults {len(traffic.faults)}, "
        f"audit exit {audit.returncode}"
    )
    assert not traffic.faults, "\n".join(traffic.faults)
    # Each admitted key made one order: no key forwarded under two upstream keys.
    assert stats["orders"] == len(traffic.orders), stats
    assert audit.returncode == 0, audit.stdout + audit.stderr
