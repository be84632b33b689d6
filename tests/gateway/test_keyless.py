"""HTTP agents that send no Idempotency-Key, on a route that keys such requests by
their content (`keyless: content`, issue 29): repeats attach to the first request's
escalation, ambiguity or answer, so the tool API makes the effect once; and the
person who decided an escalation, with their reason, reaches the agent on the repeat
of its key (with a key or without). On a route whose identical requests are meant to
repeat (`dedupe_window: 0`) a request without a key that may have been made is never
advised to be repeated: the repeat would be a second effect."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from .conftest import UPSTREAM_TIMEOUT_S, Gateway, TenantMaker
from .helpers import assert_problem, order, set_faults, supplier_stats
from .procurement import keyless_orders, order_routes
from .servers import Tenant


@pytest.fixture(scope="module")
def keyless_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("keyless", **keyless_orders())


@pytest.fixture(scope="module")
def repeats_tenant(new_tenant: TenantMaker) -> Tenant:
    """Keyless supplier orders whose identical requests are each an order of their own."""
    fields = keyless_orders()
    fields["routes"] = order_routes(keyless="content", dedupe_window="0")
    return new_tenant("repeats", **fields)


BIG = 450  # 45,000 USD: above the orders route's 30,000 USD approval threshold


def fresh_order(quantity: int) -> dict[str, Any]:
    """An order no other test sends (identical keyless requests are one effect)."""
    return order(quantity=quantity, sku=f"sku-{uuid.uuid4().hex[:8]}")


async def post(
    gateway: Gateway, tenant: Tenant, agent: str, body: dict[str, Any], key: str = ""
) -> httpx.Response:
    headers = tenant.auth(agent) | ({"Idempotency-Key": key} if key else {})
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        return await http.post("/tools/supplier/orders", json=body, headers=headers)


async def decide(gateway: Gateway, escalation: str, verdict: str, reason: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        return await http.post(
            f"/v1/escalations/{escalation}/{verdict}",
            headers=gateway.admin,
            json={"reason": reason},
        )


async def requests_for(upstream: httpx.AsyncClient, tenant: Tenant, key: str) -> int:
    stats = await supplier_stats(upstream, tenant)
    return int(stats["requests_by_key"].get(key, 0))


async def test_keyless_repeats_of_an_escalated_request_make_one_effect(
    keyless_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = keyless_tenant
    body = fresh_order(BIG)
    # Four sends, two at a time, from connections of their own.
    answers = []
    for _ in range(2):
        answers += await asyncio.gather(
            *(post(gateway, tenant, "buyer-01", body) for _ in range(2))
        )
    assert [a.status_code for a in answers] == [202] * 4
    assert len({a.json()["escalation"] for a in answers}) == 1
    assert len({a.headers["X-Irrev-Idempotency-Key"] for a in answers}) == 1
    detail = answers[0].json()["detail"]
    assert "waits for a person's approval" in detail
    assert "send the identical request again" in detail, detail
    escalation = answers[0].json()["escalation"]
    approved = await decide(gateway, escalation, "approve", "restock for Q1")
    assert approved.status_code == 201, approved.text
    again = await post(gateway, tenant, "buyer-01", body)
    assert again.status_code == 201, again.text
    assert again.headers["X-Irrev-Replayed"] == "true"
    assert unquote(again.headers["X-Irrev-Decided-By"]) == "operator:ops"
    assert unquote(again.headers["X-Irrev-Note"]) == "restock for Q1"
    assert again.json() == approved.json()
    upstream_key = f"irrev-{again.headers['X-Irrev-Hold']}"
    assert await requests_for(upstream, tenant, upstream_key) == 1


async def test_a_keyless_repeat_of_an_ambiguous_request_is_the_same_effect(
    keyless_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    """The first send made the order and answered 504: ambiguous. The repeat is sent
    again under the same upstream key, which the supplier deduplicates: one order."""
    tenant = keyless_tenant
    body = fresh_order(3)
    await set_faults(upstream, tenant, status=504, apply=True, times=1)
    try:
        first = await post(gateway, tenant, "buyer-02", body)
    finally:
        await set_faults(upstream, tenant, times=0)
    assert_problem(first, 502, "upstream_ambiguous")
    assert first.json()["retry"] == "same_call"
    again = await post(gateway, tenant, "buyer-02", body)
    assert again.status_code == 201, again.text
    assert again.headers["X-Irrev-Hold"] == first.headers["X-Irrev-Hold"]
    stats = await supplier_stats(upstream, tenant)
    upstream_key = f"irrev-{again.headers['X-Irrev-Hold']}"
    assert upstream_key in stats["keys"]
    assert stats["requests_by_key"][upstream_key] == 2  # the retry, under the same key


async def test_different_requests_are_different_effects(
    keyless_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = keyless_tenant
    sku = f"sku-{uuid.uuid4().hex[:8]}"
    one = await post(gateway, tenant, "buyer-03", order(quantity=2, sku=sku))
    two = await post(gateway, tenant, "buyer-03", order(quantity=3, sku=sku))
    same = await post(gateway, tenant, "buyer-03", order(quantity=2, sku=sku))
    assert [r.status_code for r in (one, two, same)] == [201, 201, 201]
    assert one.headers["X-Irrev-Hold"] != two.headers["X-Irrev-Hold"]
    assert same.headers["X-Irrev-Hold"] == one.headers["X-Irrev-Hold"]
    assert same.headers["X-Irrev-Replayed"] == "true"
    assert same.json() == one.json()


async def test_a_route_without_keyless_still_needs_a_key(
    keyless_tenant: Tenant, gateway: Gateway
) -> None:
    tenant = keyless_tenant
    refund = {"customer_id": "c1", "amount": "10"}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        response = await http.post(
            "/tools/payments/refunds", json=refund, headers=tenant.auth("buyer-01")
        )
    problem = assert_problem(response, 400, "idempotency_key_required")
    assert problem["retry"] == "fix"


@pytest.mark.parametrize("keyed", [True, False], ids=["key", "keyless"])
async def test_a_rejection_reaches_the_agent_on_its_repeat(
    keyless_tenant: Tenant, gateway: Gateway, keyed: bool
) -> None:
    tenant = keyless_tenant
    body = fresh_order(BIG)
    key = uuid.uuid4().hex if keyed else ""
    pending = await post(gateway, tenant, "buyer-04", body, key)
    assert pending.status_code == 202, pending.text
    rejected = await decide(gateway, pending.json()["escalation"], "reject", "supplier on hold")
    assert rejected.status_code == 200, rejected.text
    repeat = await post(gateway, tenant, "buyer-04", body, key)
    problem = assert_problem(repeat, 403, "escalation_rejected")
    assert (problem["by"], problem["note"]) == ("operator:ops", "supplier on hold")
    said = 'A person (operator:ops) rejected this call, saying: "supplier on hold"'
    assert said in problem["detail"]
    assert problem["retry"] == "no"


def assert_not_asked_to_repeat(text: str) -> None:
    """A request held under a key of its own (none sent, `dedupe_window: 0`): an
    identical request is a new effect, so the agent is told to check, never to repeat."""
    assert "keyless-" not in text and "Idempotency-Key" not in text, text
    assert "repeat the same call" not in text and "identical request again" not in text, text
    assert "under the same key" not in text, text
    assert "do not make this call again" in text, text
    assert "whether it was made (read what it changes, or list what exists)" in text, text


# The supplier records the order, then hangs past the gateway's upstream timeout, or
# answers 503 (a flaky API): either way the gateway cannot tell whether it was made.
AMBIGUOUS_FAULTS: dict[str, tuple[dict[str, Any], int]] = {
    "hang": ({"delay_s": UPSTREAM_TIMEOUT_S + 1.5}, 504),
    "5xx": ({"status": 503}, 502),
}


@pytest.mark.parametrize("fault", list(AMBIGUOUS_FAULTS))
async def test_an_ambiguous_keyless_request_that_repeats_is_not_advised_again(
    repeats_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient, fault: str
) -> None:
    """The old advice (retry same_call, "repeat the same call later") paid twice: the
    identical request is a new order on this route. The agent is told to check instead,
    and the check finds the one order the first request made."""
    tenant = repeats_tenant
    faults, status = AMBIGUOUS_FAULTS[fault]
    body = fresh_order(2)
    before = (await supplier_stats(upstream, tenant))["orders"]
    await set_faults(upstream, tenant, apply=True, times=1, **faults)
    try:
        first = await post(gateway, tenant, "buyer-01", body)
    finally:
        await set_faults(upstream, tenant, times=0)
    problem = assert_problem(first, status, "upstream_ambiguous")
    assert problem["retry"] == "no", problem
    assert_not_asked_to_repeat(problem["detail"])
    # Following the new advice: the check finds the order, and nothing is sent again.
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 1
    # Following the old one: the identical request is a second order, a second charge.
    again = await post(gateway, tenant, "buyer-01", body)
    assert again.status_code == 201, again.text
    assert again.headers["X-Irrev-Hold"] != first.headers["X-Irrev-Hold"]
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 2


async def test_a_keyless_escalation_that_repeats_is_polled_not_repeated(
    repeats_tenant: Tenant, gateway: Gateway
) -> None:
    """A pending request's only way back is its escalation's URL: the identical request
    is a second escalation, and a second order once both are approved."""
    tenant = repeats_tenant
    body = fresh_order(BIG)
    pending = await post(gateway, tenant, "buyer-01", body)
    assert pending.status_code == 202, pending.text
    said = pending.json()
    assert said["retry"] == "no", said
    assert f"Poll {said['poll']} for the result" in said["detail"]
    assert "Idempotency-Key" not in said["detail"], said["detail"]
    assert "identical request again" not in said["detail"], said["detail"]
    assert "do not send this request again" in said["detail"], said["detail"]
    again = await post(gateway, tenant, "buyer-01", body)
    assert again.status_code == 202, again.text
    assert again.json()["escalation"] != said["escalation"]


async def test_a_keyless_escalation_that_repeats_and_ends_ambiguous_is_not_advised_again(
    repeats_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    """Approved, and the forward's outcome unknown (the supplier made the order and
    answered 503): the poll the 202 pointed the agent to must not tell it to repeat
    the call, which on this route is a second escalation and a second order."""
    tenant = repeats_tenant  # buyer-02: the other tests escalate buyer-01's budget
    pending = await post(gateway, tenant, "buyer-02", fresh_order(BIG))
    assert pending.status_code == 202, pending.text
    escalation = pending.json()["escalation"]
    await set_faults(upstream, tenant, apply=True, times=1, status=503)
    try:
        approved = await decide(gateway, escalation, "approve", "restock")
    finally:
        await set_faults(upstream, tenant, times=0)
    assert approved.status_code == 502, approved.text
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        polled = await http.get(pending.json()["poll"], headers=tenant.auth("buyer-02"))
    problem = assert_problem(polled, 502, "upstream_ambiguous")
    assert problem["retry"] == "no", problem
    assert_not_asked_to_repeat(problem["detail"])
