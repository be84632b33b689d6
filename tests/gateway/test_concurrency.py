"""Contracts under concurrency, through real gateway workers: no overdraw with 120
effects in flight over two worker processes, one upstream effect per Idempotency-Key,
and one winner among concurrent approvals of one escalation."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Gateway, TenantMaker
from .helpers import (
    assert_no_overdraw,
    assert_problem,
    balances,
    effect_headers,
    holds_in,
    ledger_audit,
    order,
    set_faults,
    supplier_stats,
    used,
)
from .servers import Tenant


@pytest.fixture(scope="module")
def overdraw_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("overdraw")


# One agent sends one key 20 times at once: more than a worker's default bound on
# an agent's requests in flight (request_limits.max_in_flight, 16).
@pytest.fixture(scope="module")
def idempotency_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("idempotency", request_limits={"max_in_flight": 64})


@pytest.fixture(scope="module")
def approvals_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("approvals")


# A short hold TTL, so that a hold's deadline passes within a test.
@pytest.fixture(scope="module")
def short_ttl_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("short-ttl", hold_ttl="5s", escalation_ttl="2s")


IN_FLIGHT = 120


async def test_many_effects_in_flight_never_overdraw(
    overdraw_tenant: Tenant,
    gateway: Gateway,
    peer_gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    tenant = overdraw_tenant
    # Each order stays in flight at the supplier for a while, so admissions overlap.
    await set_faults(upstream, tenant, delay_s=0.2)
    agents = [f"buyer-{n:02d}" for n in range(1, 51)]
    suppliers = ["acme-steel", "s2", "s3"]
    quantities = [20, 60, 100, 150, 200]  # 2000 to 20000 USD each

    async def send(i: int, agent: str, supplier: str, quantity: int) -> httpx.Response:
        # Every other effect goes through the peer gateway process.
        base = gateway.url if i % 2 else peer_gateway.url
        return await http.post(
            f"{base}/tools/supplier/orders",
            json=order(quantity=quantity, supplier_id=supplier),
            headers={
                **effect_headers(tenant, agent, f"burst-{i}"),
                "X-Request-Id": f"burst-{tenant.id}-{i}",
            },
        )

    plan = zip(itertools.cycle(agents), itertools.cycle(suppliers), itertools.cycle(quantities))
    responses = await asyncio.gather(
        *(send(i, *p) for i, p in zip(range(IN_FLIGHT), plan, strict=False))
    )

    by_status: dict[int, list[httpx.Response]] = {}
    for response in responses:
        by_status.setdefault(response.status_code, []).append(response)
    unexpected = {s: r[0].text for s, r in by_status.items() if s not in (201, 202, 403)}
    assert not unexpected, unexpected
    admitted, escalated, denied = (by_status.get(s, []) for s in (201, 202, 403))
    # The burst asks for far more than the tenant's 250000 USD: all three outcomes occur.
    assert admitted and denied, {s: len(r) for s, r in by_status.items()}
    for response in denied:
        assert_problem(response, 403, "budget_exceeded")

    rows = await balances(http, gateway.admin, tenant)
    assert_no_overdraw(rows)
    # Conservation: the tenant account holds exactly the prices of what was let through.
    charged = sum(int(r.headers["x-irrev-price"]) for r in admitted + escalated)
    assert used(rows)[f"tenant:{tenant.id}"] == charged

    # Every admitted effect reached the supplier once; nothing else did.
    posted = await holds_in(http, gateway.admin, tenant, "posted")
    stats = await supplier_stats(upstream, tenant)
    assert stats["orders"] == len(posted) == len(admitted)
    assert stats["requests"] == len(admitted)
    assert {f"irrev-{h}" for h in posted} == set(stats["keys"])
    assert len(await holds_in(http, gateway.admin, tenant, "escalated")) == len(escalated)

    # The burst was admitted by several gateway processes sharing one Redis: the peer's
    # among them (the gateway's two workers alone made a count of processes pass).
    served_by = {
        server.url: {
            entry["pid"]
            for entry in server.log_entries()
            if str(entry.get("request_id", "")).startswith(f"burst-{tenant.id}-")
        }
        for server in (gateway, peer_gateway)
    }
    assert all(served_by.values()), served_by
    # The peer groups its concurrent reserves (IRREV_GROUP_WAIT_MS): some of its script
    # calls carried several, and the promises above held all the same.
    exposition = await http.get(f"{peer_gateway.url}/metrics", headers=gateway.admin)
    assert grouped_calls(exposition.text, "reserve") > 0

    audit = ledger_audit(gateway.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def grouped_calls(exposition: str, operation: str) -> float:
    """Script calls of `operation` that group commit sent with more than one call."""
    (family,) = (
        f for f in text_string_to_metric_families(exposition) if f.name == "irrev_ledger_group_size"
    )
    counts = {
        (sample.name, sample.labels.get("le")): sample.value
        for sample in family.samples
        if sample.labels.get("operation") == operation
    }
    return (
        counts[("irrev_ledger_group_size_count", None)]
        - counts[("irrev_ledger_group_size_bucket", "1.0")]
    )


async def test_one_key_sent_twenty_times_is_one_effect(
    idempotency_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    tenant = idempotency_tenant
    headers = effect_headers(tenant, "buyer-01", "same-key")
    # The first forward takes a while, so the repeats arrive while it is in flight.
    await set_faults(upstream, tenant, delay_s=0.3, times=1)
    responses = await asyncio.gather(
        *(http.post("/tools/supplier/orders", json=order(), headers=headers) for _ in range(20))
    )

    first = [r for r in responses if r.status_code == 201 and "x-irrev-replayed" not in r.headers]
    assert len(first) == 1
    order_id = first[0].json()["order_id"]
    for response in responses:
        if response is first[0]:
            continue
        if response.status_code == 409:
            assert_problem(response, 409, "in_flight")
            assert response.headers["retry-after"] == "1"
        else:
            assert response.status_code == 201, response.text
            assert response.headers["x-irrev-replayed"] == "true"
            assert response.json()["order_id"] == order_id
    assert any(r.status_code == 409 for r in responses)

    stats = await supplier_stats(upstream, tenant)
    assert (stats["orders"], stats["requests"]) == (1, 1)
    price = int(first[0].headers["x-irrev-price"])
    assert used(await balances(http, gateway.admin, tenant))[f"tenant:{tenant.id}"] == price

    # Once settled, a repeat gets the recorded answer; the supplier hears nothing more.
    again = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert again.status_code == 201
    assert again.json()["order_id"] == order_id
    assert again.headers["x-irrev-hold"] == first[0].headers["x-irrev-hold"]
    # A number is read by value: the same order with its quantity spelled 10.0 or 1e1
    # is the same request, answered from the record, not a conflict.
    for quantity in ("10.0", "1e1"):
        body = json.dumps(order()).replace('"quantity": 10,', f'"quantity": {quantity},')
        respelled = await http.post(
            "/tools/supplier/orders",
            content=body.encode(),
            headers={**headers, "Content-Type": "application/json"},
        )
        assert respelled.status_code == 201, respelled.text
        assert respelled.headers["x-irrev-replayed"] == "true"
        assert respelled.json()["order_id"] == order_id
    # The same key for a different request is a conflict and changes nothing.
    before = await balances(http, gateway.admin, tenant)
    conflict = await http.post("/tools/supplier/orders", json=order(quantity=11), headers=headers)
    assert_problem(conflict, 409, "idempotency_conflict")
    assert await balances(http, gateway.admin, tenant) == before
    assert (await supplier_stats(upstream, tenant))["requests"] == 1


async def escalate(http: httpx.AsyncClient, tenant: Tenant, key: str) -> str:
    """An order priced above the route's approval threshold (30000 USD): its poll URL."""
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=450),  # 45000 USD face value
        headers=effect_headers(tenant, "buyer-01", key),
    )
    assert response.status_code == 202, response.text
    assert response.headers["x-irrev-decision"] == "escalate"
    body = response.json()
    assert response.headers["location"] == body["poll"] == f"/v1/escalations/{body['escalation']}"
    return str(response.headers["location"])


async def test_concurrent_approvals_have_one_winner(
    approvals_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = approvals_tenant
    location = await escalate(http, tenant, "big-order")
    waiting = await http.get(location, headers=tenant.auth("buyer-01"))
    assert waiting.status_code == 202
    assert waiting.json()["status"] == "escalated"
    assert (await supplier_stats(upstream, tenant))["requests"] == 0
    charged = used(await balances(http, gateway.admin, tenant))[f"tenant:{tenant.id}"]
    assert charged > 30_000 * 10**6  # the escalation holds its budget

    approvals = await asyncio.gather(
        *(http.post(f"{location}/approve", headers=gateway.admin) for _ in range(16))
    )
    winners = [r for r in approvals if r.status_code == 201]
    assert len(winners) == 1, [r.text for r in approvals]
    assert winners[0].headers["x-irrev-escalation"] == "approved"
    for response in approvals:
        if response is not winners[0]:
            body = assert_problem(response, 409, "escalation_resolved")
            assert body["by"] == "operator:ops"
    stats = await supplier_stats(upstream, tenant)
    assert (stats["orders"], stats["requests"]) == (1, 1)

    # The agent's poll now returns the upstream's answer.
    done = await http.get(location, headers=tenant.auth("buyer-01"))
    assert done.status_code == 201
    assert done.json() == winners[0].json()
    hold = winners[0].headers["x-irrev-hold"]
    assert hold in await holds_in(http, gateway.admin, tenant, "posted")
    assert used(await balances(http, gateway.admin, tenant))[f"tenant:{tenant.id}"] == charged


async def test_rejection_releases_the_budget_and_is_final(
    approvals_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = approvals_tenant
    before = used(await balances(http, gateway.admin, tenant))
    requests_before = (await supplier_stats(upstream, tenant))["requests"]
    location = await escalate(http, tenant, "rejected-order")
    rejections = await asyncio.gather(
        *(http.post(f"{location}/reject", headers=gateway.admin) for _ in range(8))
    )
    assert sorted(r.status_code for r in rejections) == [200] + [409] * 7
    late = await http.post(f"{location}/approve", headers=gateway.admin)
    assert_problem(late, 409, "escalation_resolved")
    poll = await http.get(location, headers=tenant.auth("buyer-01"))
    assert_problem(poll, 403, "escalation_rejected")
    assert used(await balances(http, gateway.admin, tenant)) == before
    assert (await supplier_stats(upstream, tenant))["requests"] == requests_before


async def test_unapproved_escalation_expires_and_releases_its_budget(
    short_ttl_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = short_ttl_tenant  # escalation_ttl 2s, swept every 0.5 s
    before = used(await balances(http, gateway.admin, tenant))
    location = await escalate(http, tenant, "expiring-order")
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        poll = await http.get(location, headers=tenant.auth("buyer-01"))
        if poll.status_code != 202:
            break
        assert asyncio.get_running_loop().time() < deadline, "the escalation never expired"
        await asyncio.sleep(0.2)
    assert_problem(poll, 403, "escalation_expired")
    assert used(await balances(http, gateway.admin, tenant)) == before
    late = await http.post(f"{location}/approve", headers=gateway.admin)
    assert_problem(late, 409, "escalation_resolved")
    assert (await supplier_stats(upstream, tenant))["requests"] == 0
