"""Settlement roles, end to end: only the trusted side (the gateway, a tool's settler
credential, an admin) settles a proxied hold; agents settle their in-process holds
within bounds; settlers true up realised losses; a route learns one outcome per
hold and never from an agent's say-so; learned counts never break a reload."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.state.policies import policy_version
from gateway.state.policy_changes import StoreVersion
from gateway.state.tenants import TenantStore
from ledger.client import Ledger
from ledger.cluster import RedisClient, redis_client
from ledger.keys import accounts_key, observed_key
from ledger.limits import MAX_AMOUNT
from pricing.credentials import format_token, hash_token

from .conftest import Gateway, TenantMaker, policy_dir_of
from .helpers import (
    assert_problem,
    balances,
    based,
    effect_headers,
    ledger_audit,
    order,
    set_faults,
    supplier_stats,
)
from .procurement import LEARNING_ROUTES
from .servers import Tenant, write_policy


@pytest.fixture(scope="module")
def settle_abuse_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("settle-abuse")


@pytest.fixture(scope="module")
def settle_roles_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("settle-roles")


@pytest.fixture(scope="module")
def settle_bounds_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("settle-bounds")


@pytest.fixture(scope="module")
def settle_learn_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("settle-learn", routes=LEARNING_ROUTES)


@pytest.fixture(scope="module")
def settle_upload_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("settle-upload", routes=LEARNING_ROUTES)


DEPLOY = {"tool": "deploy", "method": "POST", "path": "/deploys"}
DEPLOY_ROUTE = "deploy POST /deploys"
MAX = MAX_AMOUNT
USD = 10**6


@pytest.fixture
async def redis(gateway: Gateway) -> AsyncIterator[RedisClient]:
    client = redis_client(gateway.redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def buy(http: httpx.AsyncClient, tenant: Tenant, key: str, **fields: Any) -> httpx.Response:
    return await http.post(
        "/tools/supplier/orders",
        json=order(**fields),
        headers=effect_headers(tenant, "buyer-01", key),
    )


async def deploy(http: httpx.AsyncClient, tenant: Tenant, key: str) -> tuple[str, int]:
    created = await http.post(
        "/v1/holds", json=DEPLOY, headers=effect_headers(tenant, "deployer-01", key)
    )
    assert created.status_code == 201, created.text
    return created.json()["hold"], int(created.headers["x-irrev-price"])


def audited(gateway: Gateway, tenant: Tenant) -> None:
    audit = ledger_audit(gateway.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_an_agent_compensating_its_payments_stays_within_its_window_cap(
    settle_abuse_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    """Observation 1: 30 effects, each followed by the agent's compensation of its full
    price, executed 30 effects against a cap that fits a few and left the agent's
    posted balance at 0."""
    tenant = settle_abuse_tenant
    me = tenant.auth("buyer-01")
    answers = []
    for i in range(30):
        response = await buy(http, tenant, f"pay-{i}", quantity=100, unit_price="100")
        answers.append(response)
        if response.status_code == 201:
            price = int(response.headers["x-irrev-price"])
            await http.post(
                f"/v1/holds/{response.headers['x-irrev-hold']}/compensate",
                json={"recovered_micros": price},
                headers=me,
            )
    executed = (await supplier_stats(upstream, tenant))["orders"]
    agent = (await balances(http, gateway.admin, tenant))["agent:buyer-01"]
    assert executed * price == agent["posted"] <= agent["limit"]
    assert executed == sum(r.status_code == 201 for r in answers) < 30

    hold = answers[0].headers["x-irrev-hold"]
    for action, body in (
        ("compensate", {"recovered_micros": price}),
        ("post", {"amount_micros": 0}),
        ("void", None),
        ("ambiguous", {}),
        ("settle", {"realised_micros": 0}),
    ):
        refused = await http.post(f"/v1/holds/{hold}/{action}", json=body, headers=me)
        assert_problem(refused, 403, "settlement_forbidden")
    assert (await balances(http, gateway.admin, tenant))["agent:buyer-01"] == agent
    audited(gateway, tenant)


async def test_an_agent_cannot_release_a_hold_while_it_is_forwarded(
    settle_roles_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    tenant = settle_roles_tenant
    me = tenant.auth("buyer-01")
    # The supplier holds its answer until the refusals are done (a 0.35 s delay timed
    # out under a 1 s upstream timeout in a loaded CI run, 0.6 s before it).
    await set_faults(upstream, tenant, hold=True, times=1)
    in_flight = asyncio.create_task(buy(http, tenant, "slow"))
    deadline = time.monotonic() + 10
    while (await supplier_stats(upstream, tenant))["requests"] == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    holds = await http.get(
        f"/v1/admin/tenants/{tenant.id}/holds",
        params={"state": "pending"},
        headers=gateway.admin,
    )
    (hold,) = [h["hold"] for h in holds.json()]
    for action, body in (("void", None), ("post", {"amount_micros": 0}), ("ambiguous", {})):
        refused = await http.post(f"/v1/holds/{hold}/{action}", json=body, headers=me)
        assert_problem(refused, 403, "settlement_forbidden")
    assert (await upstream.post(f"/{tenant.id}/_release")).status_code == 200
    answer = await in_flight
    assert answer.status_code == 201, answer.text
    view = (await http.get(f"/v1/holds/{hold}", headers=me)).json()
    assert view["state"] == "posted"
    assert set(view["posted"].values()) == {int(answer.headers["x-irrev-price"])}


async def test_a_settler_trues_up_its_tools_holds(
    settle_bounds_tenant: Tenant,
    settle_roles_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
) -> None:
    """docs/design.md's settlement: the tool API reports the realised residual; the
    rest returns to the budget, more is posted as a flagged overrun, never above
    the face value."""
    tenant = settle_roles_tenant
    face = 10 * 100 * USD
    answer = await buy(http, tenant, "trued-up", quantity=10, unit_price="100")
    assert answer.status_code == 201, answer.text
    hold, price = answer.headers["x-irrev-hold"], int(answer.headers["x-irrev-price"])
    assert price < face
    settle = f"/v1/holds/{hold}/settle"

    async def agent_posted() -> int:
        rows = await balances(http, gateway.admin, tenant)
        return int(rows["agent:buyer-01"]["posted"])

    before = await agent_posted()
    wrong_tool = await http.post(
        settle, json={"realised_micros": 0}, headers=tenant.settler("payments")
    )
    assert_problem(wrong_tool, 403, "settlement_forbidden")
    other_tenant = settle_bounds_tenant.settler("supplier")
    assert_problem(
        await http.post(settle, json={"realised_micros": 0}, headers=other_tenant), 404, "not_found"
    )

    mine = tenant.settler("supplier")
    for realised, flags in ((price // 4, []), (price // 4, []), (face, ["overrun"])):
        response = await http.post(settle, json={"realised_micros": realised}, headers=mine)
        assert response.status_code == 200, response.text
        assert (response.json()["state"], response.json()["flags"]) == ("posted", flags)
        assert await agent_posted() == before - price + realised
    above = await http.post(settle, json={"realised_micros": face + 1}, headers=mine)
    assert_problem(above, 422, "amount_above_face_value")
    assert_problem(
        await http.post(settle, json={"realised_micros": 0}, headers=gateway.admin),
        404,
        "unknown_tenant",
    )
    by_admin = await http.post(
        settle,
        params={"tenant": tenant.id},
        json={"realised_micros": 0},
        headers=gateway.admin,
    )
    assert by_admin.status_code == 200, by_admin.text
    assert await agent_posted() == before - price
    audited(gateway, tenant)


async def test_an_agent_reports_no_more_than_it_was_priced_at(
    settle_bounds_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Observation 3: an agent's post of 2^53-1 on its own hold overdrew the tenant
    for the rest of the window. And an irreversible effect is not the agent's to
    compensate."""
    tenant = settle_bounds_tenant
    me = tenant.auth("deployer-01")
    hold, price = await deploy(http, tenant, "huge")
    before = await balances(http, gateway.admin, tenant)
    huge = await http.post(f"/v1/holds/{hold}/post", json={"amount_micros": MAX}, headers=me)
    assert_problem(huge, 422, "amount_above_price")
    rows = await balances(http, gateway.admin, tenant)
    assert rows == before
    assert all(r["pending"] + r["posted"] <= r["limit"] for r in rows.values())
    audited(gateway, tenant)

    assert (await http.post(f"/v1/holds/{hold}/post", json={}, headers=me)).status_code == 200
    back = await http.post(f"/v1/holds/{hold}/compensate", json={"recovered_micros": 1}, headers=me)
    assert_problem(back, 403, "not_compensable")
    by_settler = await http.post(
        f"/v1/holds/{hold}/compensate",
        json={"recovered_micros": price},
        headers=tenant.settler("deploy"),
    )
    assert by_settler.status_code == 200, by_settler.text
    audited(gateway, tenant)


async def test_a_hold_teaches_its_route_once_and_never_on_an_agents_word(
    settle_learn_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, redis: RedisClient
) -> None:
    """Observation 2: every compensation counted one outcome, so one agent's reports
    repriced a route for the whole tenant."""
    tenant = settle_learn_tenant
    me, settler = tenant.auth("deployer-01"), tenant.settler("deploy")
    failures, successes = observed_key(tenant.id, "failures"), observed_key(tenant.id, "successes")

    async def counts() -> tuple[int, int]:
        return (
            int(await redis.hget(failures, DEPLOY_ROUTE) or 0),
            int(await redis.hget(successes, DEPLOY_ROUTE) or 0),
        )

    for i in range(3):
        hold, price = await deploy(http, tenant, f"agent-{i}")
        assert (await http.post(f"/v1/holds/{hold}/post", json={}, headers=me)).status_code == 200
        for recovered in (0, 0, 1):
            back = await http.post(
                f"/v1/holds/{hold}/compensate", json={"recovered_micros": recovered}, headers=me
            )
            assert back.status_code == 200, back.text
    assert await counts() == (0, 0)

    hold, price = await deploy(http, tenant, "settled")
    over = await http.post(f"/v1/holds/{hold}/post", json={"amount_micros": 1001 * USD}, headers=me)
    assert_problem(over, 422, "amount_above_face_value")
    reported = await http.post(
        f"/v1/holds/{hold}/post", json={"amount_micros": price + 1}, headers=me
    )
    assert reported.json()["flags"] == ["overrun"]
    for _ in range(3):
        back = await http.post(
            f"/v1/holds/{hold}/compensate", json={"recovered_micros": 0}, headers=settler
        )
        assert back.status_code == 200, back.text
    trued = await http.post(
        f"/v1/holds/{hold}/settle", json={"realised_micros": 0}, headers=settler
    )
    assert trued.status_code == 200, trued.text
    assert await counts() == (1, 0)
    audited(gateway, tenant)


async def test_learned_counts_past_their_bound_never_stop_an_upload(
    settle_learn_tenant: Tenant,
    settle_upload_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    redis: RedisClient,
) -> None:
    """Observation 2's cascade: past 1e6 learned outcomes every reload failed, and an
    upload answered 422 "not applied" while its file and limits were applied, and a
    revoked agent kept authenticating."""
    tenant = settle_upload_tenant
    await redis.hset(observed_key(tenant.id, "failures"), DEPLOY_ROUTE, 3_000_000)
    await redis.hset(observed_key(tenant.id, "successes"), DEPLOY_ROUTE, 7)
    path = policy_dir_of(gateway) / f"{tenant.id}.yaml"
    data = yaml.safe_load(path.read_text())
    data["agents"]["buyer-02"]["token_sha256"] = hash_token(format_token(bytes(32)))
    data["accounts"]["principals"]["facilities"]["limit"] = "61000"
    url = f"/v1/admin/tenants/{tenant.id}/policy"
    headers = await based(http, tenant.id, gateway.admin)
    uploaded = await http.put(url, content=yaml.safe_dump(data), headers=headers)
    assert uploaded.status_code == 200, uploaded.text

    deadline = time.monotonic() + 20
    refused = 0
    while refused < 6:  # from whichever workers answer: all have reloaded
        assert time.monotonic() < deadline, "the revoked token still authenticates"
        response = await http.post(
            "/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "buyer-02", f"revoked-{time.monotonic()}"),
        )
        refused = refused + 1 if response.status_code == 401 else 0
        await asyncio.sleep(0.05)
    _, price = await deploy(http, tenant, "clamped")
    assert 0 < price <= 1000 * USD

    written = path.read_text()
    limit = (await balances(http, gateway.admin, tenant))["principal:facilities"]["limit"]
    assert limit == 61_000 * USD
    clash = dict(data, agents={**data["agents"]})
    clash["agents"]["buyer-03"] = {
        **data["agents"]["buyer-03"],
        "token_sha256": hash_token(settle_learn_tenant.tokens["buyer-01"]),
    }
    clash["accounts"] = {**data["accounts"], "tenant": {"limit": "1"}}
    headers = await based(http, tenant.id, gateway.admin)
    failed = await http.put(url, content=yaml.safe_dump(clash), headers=headers)
    assert_problem(failed, 422, "invalid_policy")
    assert path.read_text() == written
    rows = await balances(http, gateway.admin, tenant)
    assert rows["principal:facilities"]["limit"] == limit
    assert rows[f"tenant:{tenant.id}"]["limit"] == 250_000 * USD


async def test_an_upload_whose_limits_cannot_be_written_yet_is_stored_and_served_later(
    redis_url: str, tmp_path: Path
) -> None:
    """Once the store holds an upload it is the fleet's (other hosts serve it): one
    whose account write fails here (Redis refuses one of its accounts) is answered
    stored with its limits pending, not refused, and the next look once Redis takes
    the write serves it and writes its limits."""
    tenant = write_policy(tmp_path, "procurement", f"t-{uuid.uuid4().hex[:10]}", "http://x")
    path = tmp_path / f"{tenant.id}.yaml"
    written = path.read_text()
    ledger = Ledger.from_url(redis_url)
    try:
        store = TenantStore(tmp_path)
        await store.load(ledger)
        data = yaml.safe_load(written)
        data["accounts"]["principals"]["ops"] = {"limit": "5"}
        data["agents"]["buyer-02"]["token_sha256"] = hash_token(format_token(bytes(32)))
        await ledger.redis.hset(accounts_key(tenant.id), "principal:ops|limit", "not a number")
        base = StoreVersion(1, policy_version(written))
        uploaded = await store.upload(ledger, tenant.id, yaml.safe_dump(data), base, "test")
        assert uploaded.limits_pending and uploaded.version.number == 2
        assert path.read_text() == written  # the host's file is one way in, not rewritten
        assert store.authenticate(tenant.tokens["buyer-02"]) is not None  # not served yet
        await ledger.redis.hdel(accounts_key(tenant.id), "principal:ops|limit")
        await store.refresh(ledger)  # what a worker does next
        assert store.authenticate(tenant.tokens["buyer-02"]) is None
        limits = {b.account: b.limit for b in await ledger.balances(tenant.id)}
        assert limits["principal:ops"] == 5 * 10**6
    finally:
        await ledger.aclose()
