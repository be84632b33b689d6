"""What the upstream's answer does to a hold: 2xx posts, 4xx or never sent voids and
restores the budget, a timeout or 5xx leaves it ambiguous and charged until a retry
(same Idempotency-Key) or the reconciler resolves it by looking the order up."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from irrev.harness import free_port, uvicorn_command

from .conftest import Gateway, TenantMaker, own_gateway
from .helpers import (
    assert_problem,
    balances,
    effect_headers,
    order,
    raw_request,
    set_faults,
    supplier_stats,
    used,
)
from .procurement import tools_at
from .servers import Server, Tenant, base_env


@pytest.fixture(scope="module")
def outcomes_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("outcomes")


# Its tools point at a port nobody listens on.
@pytest.fixture(scope="module")
def unreachable_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("unreachable", tools=tools_at(f"http://127.0.0.1:{free_port()}"))


@pytest.fixture(scope="module")
def retry_trace_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("retry-trace")


# A deadline that passes within a test, with room before it for the test's own
# steps on a loaded machine.
@pytest.fixture(scope="module")
def reconcile_ttl_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("reconcile-ttl", hold_ttl="8s")


@pytest.fixture(scope="module")
def retry_race_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("retry-race", hold_ttl="5s", escalation_ttl="2s")


# Where a test runs a supplier of its own that it can kill between an ambiguous send
# and its retry.
RETRY_SUPPLIER_PORT = free_port()


# Its tools point at RETRY_SUPPLIER_PORT, where a test runs a supplier of its own
# that it can kill between an ambiguous send and its retry.
@pytest.fixture(scope="module")
def retry_unsent_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("retry-unsent", tools=tools_at(f"http://127.0.0.1:{RETRY_SUPPLIER_PORT}"))


@pytest.fixture(scope="module")
def accept_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("accept")


@pytest.fixture(scope="module")
def not_acceptable_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("not-acceptable")


@pytest.fixture(scope="module")
def unsendable_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("unsendable")


async def hold_state(http: httpx.AsyncClient, tenant: Tenant, agent: str, hold: str) -> str:
    response = await http.get(f"/v1/holds/{hold}", headers=tenant.auth(agent))
    assert response.status_code == 200, response.text
    state: str = response.json()["state"]
    return state


async def reconcile(http: httpx.AsyncClient, gateway: Gateway, tenant: Tenant) -> dict[str, Any]:
    response = await http.post(f"/v1/admin/tenants/{tenant.id}/reconcile", headers=gateway.admin)
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    return report


async def test_upstream_4xx_voids_and_restores_the_budget(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = outcomes_tenant
    before = used(await balances(http, gateway.admin, tenant))
    await set_faults(upstream, tenant, status=409, apply=False, times=1)
    headers = effect_headers(tenant, "buyer-01", "refused")
    response = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert response.status_code == 409  # the supplier's own answer, passed through
    assert response.json() == {"error": "injected"}
    hold = response.headers["x-irrev-hold"]
    assert await hold_state(http, tenant, "buyer-01", hold) == "voided"
    assert used(await balances(http, gateway.admin, tenant)) == before
    # A repeat gets the recorded refusal; the supplier is not asked again.
    requests = (await supplier_stats(upstream, tenant))["requests"]
    again = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert (again.status_code, again.json()) == (409, {"error": "injected"})
    assert again.headers["x-irrev-replayed"] == "true"
    assert (await supplier_stats(upstream, tenant))["requests"] == requests


async def test_unreachable_upstream_voids(
    unreachable_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = unreachable_tenant
    before = used(await balances(http, gateway.admin, tenant))
    response = await http.post(
        "/tools/supplier/orders",
        json=order(),
        headers=effect_headers(tenant, "buyer-01", "nobody-home"),
    )
    assert_problem(response, 502, "upstream_unreachable")
    hold = response.headers["x-irrev-hold"]
    assert await hold_state(http, tenant, "buyer-01", hold) == "voided"
    assert used(await balances(http, gateway.admin, tenant)) == before
    # A repeat of the key gets the kept answer: the gateway's still, not the tool's
    # (it had lost its X-Irrev-Reason; failed before the fix).
    again = await http.post(
        "/tools/supplier/orders",
        json=order(),
        headers=effect_headers(tenant, "buyer-01", "nobody-home"),
    )
    # A whole problem document as the first was (its kept body had only reason and
    # detail, no type, title or status: failed before).
    assert_problem(again, 502, "upstream_unreachable")
    assert again.headers["x-irrev-replayed"] == "true"


async def test_timeout_is_ambiguous_and_reconcile_posts_what_the_supplier_recorded(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = outcomes_tenant
    before = used(await balances(http, gateway.admin, tenant))
    # The supplier records the order, then answers after the gateway stopped waiting.
    await set_faults(upstream, tenant, delay_s=4.5, apply=True, times=1)
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=30),
        headers=effect_headers(tenant, "buyer-02", "slow"),
    )
    body = assert_problem(response, 504, "upstream_ambiguous")
    assert body["why"] == "upstream_timeout"
    hold, price = response.headers["x-irrev-hold"], int(response.headers["x-irrev-price"])
    assert await hold_state(http, tenant, "buyer-02", hold) == "ambiguous"
    charged = used(await balances(http, gateway.admin, tenant))
    assert charged[f"tenant:{tenant.id}"] - before.get(f"tenant:{tenant.id}", 0) == price

    report = await reconcile(http, gateway, tenant)
    assert hold in report["posted"]
    assert await hold_state(http, tenant, "buyer-02", hold) == "posted"
    # A log line per reconciled hold: whose effect, which route, what it cost.
    [line] = [
        e for e in gateway.log_entries() if e.get("msg") == "reconciled" and e["hold_id"] == hold
    ]
    assert (line["tenant"], line["result"], line["agent"], line["route"], line["price"]) == (
        tenant.id,
        "posted",
        "buyer-02",
        "supplier POST /orders",
        price,
    )
    assert used(await balances(http, gateway.admin, tenant)) == charged
    assert f"irrev-{hold}" in (await supplier_stats(upstream, tenant))["keys"]
    # Settled: reconciling again changes nothing.
    assert hold not in str(await reconcile(http, gateway, tenant))


async def test_5xx_is_ambiguous_and_a_retry_with_the_same_key_settles_it_once(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = outcomes_tenant
    await set_faults(upstream, tenant, status=503, apply=True, times=1)
    headers = effect_headers(tenant, "buyer-03", "flaky")
    first = await http.post("/tools/supplier/orders", json=order(quantity=7), headers=headers)
    body = assert_problem(first, 502, "upstream_ambiguous")
    assert body["upstream_status"] == 503
    hold = first.headers["x-irrev-hold"]
    assert await hold_state(http, tenant, "buyer-03", hold) == "ambiguous"
    orders = (await supplier_stats(upstream, tenant))["orders"]

    retry = await http.post("/tools/supplier/orders", json=order(quantity=7), headers=headers)
    assert retry.status_code == 201, retry.text
    assert retry.headers["x-irrev-hold"] == hold
    assert await hold_state(http, tenant, "buyer-03", hold) == "posted"
    # The supplier deduplicated the retry by the derived Idempotency-Key.
    assert (await supplier_stats(upstream, tenant))["orders"] == orders


async def test_concurrent_retries_of_an_ambiguous_hold_send_it_once(
    redis_url: str, suppliers: Server, upstream: httpx.AsyncClient, tmp_path: Path
) -> None:
    """16 repeats of an ambiguous key at once: one claims the retry and sends it; the
    others are told it is in flight. Before the claim each of them sent the effect
    again: 14 upstream calls for one hold.

    The supplier holds the retry's answer until the 15 others have been answered, and
    this gateway waits 30 s for an upstream. With the shared gateway's 1 s and the
    answer sent 0.35 s late, a loaded machine (load 11: 2 runs of 120) took more than
    the 1 s: the retry was ambiguous again, as it must be (contract 6), and no repeat
    had the 201 the test expected."""
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path,
        2,
        IRREV_UPSTREAM_TIMEOUT_S="30",
        IRREV_FORWARD_MARGIN_S="0.5",
    ) as gateway:
        tenant = gateway.tenant("own")
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60, trust_env=False) as http:
            await set_faults(upstream, tenant, status=503, apply=True, times=1)
            headers = effect_headers(tenant, "buyer-01", "claimed")
            first = await http.post(
                "/tools/supplier/orders", json=order(quantity=5), headers=headers
            )
            assert_problem(first, 502, "upstream_ambiguous")
            hold = first.headers["x-irrev-hold"]
            key = f"irrev-{hold}"
            charged = used(await balances(http, gateway.admin, tenant))

            await set_faults(upstream, tenant, hold_repeats=True, times=0)
            repeats = [
                asyncio.create_task(
                    http.post("/tools/supplier/orders", json=order(quantity=5), headers=headers)
                )
                for _ in range(16)
            ]
            # The retry cannot be answered before the release: every other repeat is.
            pending = set(repeats)
            while len(pending) > 1:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            assert len(pending) == 1
            for task in repeats:
                if task not in pending:
                    response = task.result()
                    body = assert_problem(response, 409, "in_flight")
                    assert body["hold"] == hold and int(response.headers["retry-after"]) >= 1
                    assert "Idempotency-Key" in body["detail"]
            [retried] = pending
            while not retried.done():  # the retry may still be on its way to the supplier
                if (await supplier_stats(upstream, tenant))["requests_by_key"][key] == 2:
                    break
                await asyncio.sleep(0.01)

            released = await upstream.post(f"/{tenant.id}/_release")
            assert released.status_code == 200, released.text
            response = await retried
            assert response.status_code == 201, response.text
            assert response.headers["x-irrev-hold"] == hold
            stats = await supplier_stats(upstream, tenant)
            assert stats["requests_by_key"][key] == 2  # the first send, one retry
            assert stats["orders"] == 1
            assert await hold_state(http, tenant, "buyer-01", hold) == "posted"
            assert used(await balances(http, gateway.admin, tenant)) == charged


async def test_a_retry_forwards_the_stored_request_whatever_trace_it_comes_in(
    retry_trace_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    """Decided: what is sent again is the request as it was priced and stored, its
    trace headers included; a retry's new `traceparent` neither conflicts with the key
    (trace context is not part of the effect) nor replaces the stored one. (With
    tracing on, the upstream's `traceparent` is the gateway's own span of the send.)"""
    tenant = retry_trace_tenant
    await set_faults(upstream, tenant, status=503, apply=True, times=1)
    headers = effect_headers(tenant, "buyer-01", "traced")
    first_trace = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    retry_trace = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    first = await http.post(
        "/tools/supplier/orders", json=order(), headers={**headers, "traceparent": first_trace}
    )
    assert_problem(first, 502, "upstream_ambiguous")
    retry = await http.post(
        "/tools/supplier/orders", json=order(), headers={**headers, "traceparent": retry_trace}
    )
    assert retry.status_code == 201, retry.text
    seen = (await upstream.get(f"/_headers/{tenant.id}")).json()
    received = [dict((k.lower(), v) for k, v in request) for request in seen]
    sent = [r for r in received if "idempotency-key" in r]  # not the test's own _faults
    assert len(sent) == 2
    assert [s["traceparent"] for s in sent] == [first_trace, first_trace]
    assert sent[0]["idempotency-key"] == sent[1]["idempotency-key"]


async def test_reconcile_voids_a_not_found_order_only_after_the_hold_deadline(
    reconcile_ttl_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    tenant = reconcile_ttl_tenant  # hold_ttl 8s
    before = used(await balances(http, gateway.admin, tenant))
    # The supplier neither records the order nor answers in time.
    await set_faults(upstream, tenant, delay_s=4.0, apply=False, times=1)
    response = await http.post(
        "/tools/supplier/orders",
        json=order(),
        headers=effect_headers(tenant, "buyer-04", "lost"),
    )
    assert_problem(response, 504, "upstream_ambiguous")
    hold = response.headers["x-irrev-hold"]

    # Before the deadline a forward could still land: not found is no proof.
    early = await reconcile(http, gateway, tenant)
    assert hold in early["unresolved"]
    assert await hold_state(http, tenant, "buyer-04", hold) == "ambiguous"
    assert used(await balances(http, gateway.admin, tenant)) != before

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while hold not in (report := await reconcile(http, gateway, tenant))["voided"]:
        assert hold in report["unresolved"]
        assert loop.time() < deadline, "the hold was never voided"
        await asyncio.sleep(0.25)
    assert await hold_state(http, tenant, "buyer-04", hold) == "voided"
    assert used(await balances(http, gateway.admin, tenant)) == before
    assert f"irrev-{hold}" not in (await supplier_stats(upstream, tenant))["keys"]


async def test_reconcile_never_voids_a_retry_on_its_way(
    retry_race_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    """Contract 6: an ambiguous hold past its deadline is sent again by the agent's
    retry; while that request is on its way the supplier has no order yet, so the
    reconciler's lookup says "not found". Voiding then let the order be made
    uncharged; the retry now moves the deadline first and the hold is posted."""
    tenant = retry_race_tenant
    headers = effect_headers(tenant, "buyer-01", "retried")
    await set_faults(upstream, tenant, status=503, apply=False, times=1)
    first = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert_problem(first, 502, "upstream_ambiguous")
    hold = first.headers["x-irrev-hold"]
    shown = await http.get(f"/v1/holds/{hold}", headers=tenant.auth("buyer-01"))
    while time.time() * 1000 <= shown.json()["deadline_ms"] + 50:
        await asyncio.sleep(0.05)

    # The retry's order is made only when its delayed answer is sent: as late as the
    # gateway waits (3 s), inside the forward margin (0.5 s) the hold's deadline allows
    # a tool API for recording an effect after the gateway stopped waiting.
    await set_faults(upstream, tenant, in_progress=True, delay_s=3.0, times=1)
    retry = asyncio.create_task(http.post("/tools/supplier/orders", json=order(), headers=headers))
    key = f"irrev-{hold}"
    while (await supplier_stats(upstream, tenant))["requests_by_key"].get(key, 0) < 2:
        assert not retry.done(), (await retry).text
        await asyncio.sleep(0.02)
    report = await reconcile(http, gateway, tenant)
    assert hold not in report["voided"], report
    assert hold in report["unresolved"], report

    # The supplier took longer than the gateway waits: the retry may end ambiguous
    # again, but the order was made, and the next reconcile finds and posts it.
    answer = await retry
    assert answer.status_code in (201, 504), answer.text
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while await hold_state(http, tenant, "buyer-01", hold) != "posted":
        report = await reconcile(http, gateway, tenant)
        assert hold not in report["voided"], report
        assert loop.time() < deadline, report
        await asyncio.sleep(0.1)
    assert key in (await supplier_stats(upstream, tenant))["keys"]
    rows = await balances(http, gateway.admin, tenant)
    assert used(rows)[f"tenant:{tenant.id}"] > 0


async def test_reconcile_lists_what_it_cannot_look_up(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """An in-process deploy has no lookup: an ambiguous one stays charged and listed."""
    tenant = outcomes_tenant
    created = await http.post(
        "/v1/holds",
        json={"tool": "deploy", "method": "POST", "path": "/deploys"},
        headers=effect_headers(tenant, "deployer-01", "unsure-deploy"),
    )
    assert created.status_code == 201, created.text
    hold = created.json()["hold"]
    marked = await http.post(
        f"/v1/holds/{hold}/ambiguous",
        json={"reason": "deploy_timed_out"},
        headers=tenant.auth("deployer-01"),
    )
    assert marked.json()["state"] == "ambiguous"
    charged = used(await balances(http, gateway.admin, tenant))
    report = await reconcile(http, gateway, tenant)
    assert hold in report["unresolved"]
    assert hold not in report["posted"] + report["voided"]
    assert await hold_state(http, tenant, "deployer-01", hold) == "ambiguous"
    assert used(await balances(http, gateway.admin, tenant)) == charged


async def test_an_in_progress_409_on_a_retry_keeps_the_hold_ambiguous(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """Observation 4: after a timeout the agent retries while the first request is still
    being processed; the supplier answers 409 "request in progress" (IETF
    Idempotency-Key draft). That is no refusal: the hold stays ambiguous and charged,
    nothing is recorded, and a later retry gets (and posts) the real result."""
    tenant = outcomes_tenant
    # The first request stays in progress until released, whatever the machine's load:
    # the retry reaches the supplier while it is, not within a delay's window.
    await set_faults(upstream, tenant, hold=True, in_progress=True, times=1)
    headers = effect_headers(tenant, "buyer-04", "in-progress")
    first = await http.post("/tools/supplier/orders", json=order(quantity=3), headers=headers)
    assert_problem(first, 504, "upstream_ambiguous")
    hold = first.headers["x-irrev-hold"]
    charged = used(await balances(http, gateway.admin, tenant))

    retry = await http.post("/tools/supplier/orders", json=order(quantity=3), headers=headers)
    body = assert_problem(retry, 409, "in_flight")
    assert int(retry.headers["retry-after"]) >= 1
    assert body["hold"] == hold
    assert await hold_state(http, tenant, "buyer-04", hold) == "ambiguous"
    assert used(await balances(http, gateway.admin, tenant)) == charged

    assert (await upstream.post(f"/{tenant.id}/_release")).status_code == 200
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while f"irrev-{hold}" not in (await supplier_stats(upstream, tenant))["keys"]:
        assert loop.time() < deadline, "the first request never completed"
        await asyncio.sleep(0.05)
    final = await http.post("/tools/supplier/orders", json=order(quantity=3), headers=headers)
    assert final.status_code == 201, final.text
    assert await hold_state(http, tenant, "buyer-04", hold) == "posted"
    assert used(await balances(http, gateway.admin, tenant)) == charged
    again = await http.post("/tools/supplier/orders", json=order(quantity=3), headers=headers)
    assert (again.status_code, again.headers["x-irrev-replayed"]) == (201, "true")
    assert again.json() == final.json()


async def test_a_retry_that_cannot_reach_the_upstream_keeps_the_hold_ambiguous(
    retry_unsent_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The first send made the order but answered 503 (ambiguous); the supplier then
    went down and a repeat of the key could not connect. That proves nothing about the
    first send: the hold stays ambiguous and charged, and the agent is told to keep
    the key. Before, the retry voided the hold: an order made, nothing charged."""
    tenant = retry_unsent_tenant
    supplier = Server(
        name="own supplier",
        argv=uvicorn_command("irrev.upstreams.supplier:create_supplier", RETRY_SUPPLIER_PORT),
        env=base_env(),
        log_path=tmp_path / "supplier.log",
        port=RETRY_SUPPLIER_PORT,
    )
    supplier.start("/catalog")
    try:
        async with httpx.AsyncClient(base_url=supplier.url, trust_env=False) as own:
            faults = {"status": 503, "apply": True, "times": 1}
            assert (await own.post("/_faults", json=faults)).status_code == 200
            headers = effect_headers(tenant, "buyer-01", "made-then-down")
            first = await http.post("/tools/supplier/orders", json=order(), headers=headers)
            assert_problem(first, 502, "upstream_ambiguous")
            assert (await own.get("/_stats")).json()["orders"] == 1
    finally:
        supplier.kill()
    hold = first.headers["x-irrev-hold"]
    charged = used(await balances(http, gateway.admin, tenant))

    for _ in range(2):  # the claim ended: a second repeat is tried (and fails) again
        retry = await http.post("/tools/supplier/orders", json=order(), headers=headers)
        body = assert_problem(retry, 502, "upstream_ambiguous")
        assert body["why"] == "retry_upstream_refused"
        assert "repeat the same call later" in body["detail"], body["detail"]
        assert retry.headers["x-irrev-hold"] == hold
        assert await hold_state(http, tenant, "buyer-01", hold) == "ambiguous"
        assert used(await balances(http, gateway.admin, tenant)) == charged


async def test_a_retry_answered_4xx_keeps_the_hold_ambiguous(
    outcomes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """A 429 to the retry of an ambiguous hold refuses the retry, not the first send:
    the hold stays ambiguous and charged, and a later repeat gets (and posts) the real
    result. Before, the 429 voided the hold and was replayed to every repeat."""
    tenant = outcomes_tenant
    await set_faults(upstream, tenant, status=503, apply=False, times=1)
    headers = effect_headers(tenant, "buyer-05", "rate-limited-retry")
    first = await http.post("/tools/supplier/orders", json=order(quantity=4), headers=headers)
    assert_problem(first, 502, "upstream_ambiguous")
    hold = first.headers["x-irrev-hold"]
    charged = used(await balances(http, gateway.admin, tenant))

    await set_faults(upstream, tenant, status=429, apply=False, times=1)
    retry = await http.post("/tools/supplier/orders", json=order(quantity=4), headers=headers)
    body = assert_problem(retry, 502, "upstream_ambiguous")
    assert (body["why"], body["upstream_status"]) == ("retry_upstream_429", 429)
    assert await hold_state(http, tenant, "buyer-05", hold) == "ambiguous"
    assert used(await balances(http, gateway.admin, tenant)) == charged

    final = await http.post("/tools/supplier/orders", json=order(quantity=4), headers=headers)
    assert final.status_code == 201, final.text
    assert await hold_state(http, tenant, "buyer-05", hold) == "posted"
    assert used(await balances(http, gateway.admin, tenant)) == charged


async def test_an_agents_accept_header_does_not_reach_the_upstream(
    accept_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """A framework that negotiates the answer's format after its handler ran (Express's
    res.format, a Rails respond_to after the save) makes the effect and then answers
    406 to an Accept it cannot meet. The agent chose that Accept: a 4xx it can provoke
    after the effect would void a hold whose effect happened. The gateway sends its
    own Accept instead."""
    tenant = accept_tenant
    headers = {**effect_headers(tenant, "buyer-01", "negotiated"), "Accept": "image/png"}
    response = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert response.status_code == 201, response.text
    seen = (await upstream.get(f"/_headers/{tenant.id}")).json()
    sent = [dict((k.lower(), v) for k, v in r) for r in seen]
    [forwarded] = [s for s in sent if "idempotency-key" in s]
    assert forwarded.get("accept") != "image/png"


async def test_a_406_leaves_the_hold_ambiguous_and_charged(
    not_acceptable_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    """Not Acceptable is decided when the answer is written, which many frameworks do
    after the handler made the effect: unlike the other 4xx it proves nothing about
    the effect, so the hold stays charged until a retry or the reconciler settles it."""
    tenant = not_acceptable_tenant
    before = used(await balances(http, gateway.admin, tenant))
    await set_faults(upstream, tenant, status=406, apply=True, times=1)
    headers = effect_headers(tenant, "buyer-01", "made-then-406")
    response = await http.post("/tools/supplier/orders", json=order(), headers=headers)
    assert_problem(response, 502, "upstream_ambiguous")
    hold = response.headers["x-irrev-hold"]
    assert await hold_state(http, tenant, "buyer-01", hold) == "ambiguous"
    after = used(await balances(http, gateway.admin, tenant))
    assert after["agent:buyer-01"] > before.get("agent:buyer-01", 0)


async def test_a_request_the_http_client_cannot_make_releases_its_hold(
    unsendable_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
) -> None:
    """A path of 22,000 '{', which goes out percent-encoded (66,000 characters), is
    past what httpx makes a URL of: that request provably never left, so its hold is
    released (it was left pending, then ambiguous, with a 500 saying nothing was
    admitted)."""
    tenant = unsendable_tenant
    before = used(await balances(http, gateway.admin, tenant))
    body = json.dumps({"supplier_id": "s1", "cancellation_fee": "10"}).encode()
    headers = {
        **effect_headers(tenant, "buyer-01", "long-path"),
        "Content-Type": "application/json",
    }
    target = "/tools/supplier/orders/" + "{" * 22000 + "/cancel"
    status, answered, raw = await raw_request(gateway.url, "POST", target, headers, body)
    assert status == 502, raw
    assert json.loads(raw)["why"] == "request_not_sendable"
    assert await hold_state(http, tenant, "buyer-01", answered["x-irrev-hold"]) == "voided"
    assert used(await balances(http, gateway.admin, tenant)) == before
