"""irrev/client.py and irrev/langchain.py as an agent uses them, without a model: the
tool function called directly against `irrev serve --workers 2` and the real supplier
upstream. One tool call is one effect however often it runs; a refusal, an
escalation and a busy key become what the model should read."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from langchain_core.messages import ToolMessage
from pydantic import BaseModel

from irrev.client import IrrevClient, Outcome, idempotency_key
from irrev.langchain import http_tool

from .conftest import Gateway
from .helpers import order, set_faults, supplier_stats


def client_of(
    gateway: Gateway, tenant: str, agent: str = "buyer-01", **options: Any
) -> IrrevClient:
    return IrrevClient(gateway.url, gateway.tenant(tenant).tokens[agent], pause_s=0.2, **options)


async def test_one_tool_call_is_one_effect_however_often_it_runs(
    gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = gateway.tenant("client")
    before = (await supplier_stats(upstream, tenant))["orders"]
    client = client_of(gateway, "client")
    try:
        first = await client.call("supplier", "POST", "/orders", "call_A1", json_body=order())
        again = await client.call("supplier", "POST", "/orders", "call_A1", json_body=order())
    finally:
        await client.aclose()
    assert first.ok and again.ok, (first, again)
    assert again.data == first.data
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 1


async def test_a_busy_key_is_retried_until_the_effect_is_made(
    gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = gateway.tenant("client")
    before = (await supplier_stats(upstream, tenant))["orders"]
    await set_faults(upstream, tenant, delay_s=0.35)
    client = client_of(gateway, "client", agent="buyer-02")
    try:
        both = await asyncio.gather(
            *(client.call("supplier", "POST", "/orders", "call_B", json_body=order()) for _ in "ab")
        )
    finally:
        await set_faults(upstream, tenant, delay_s=0)
        await client.aclose()
    assert all(outcome.ok for outcome in both), both
    assert both[0].data == both[1].data
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 1


async def test_a_refusal_is_a_sentence_with_its_reason_and_numbers(gateway: Gateway) -> None:
    client = client_of(gateway, "tight")  # a tenant budget of 1 USD
    try:
        outcome = await client.call("supplier", "POST", "/orders", "call_C", json_body=order())
    finally:
        await client.aclose()
    assert not outcome.ok
    assert outcome.reason == "budget_exceeded"
    assert outcome.text.startswith("The supplier call was not made (budget_exceeded):")
    assert "price" in outcome.text and "left" in outcome.text


async def test_an_escalation_is_awaited_and_approved_once(
    gateway: Gateway, http: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = gateway.tenant("client")
    before = (await supplier_stats(upstream, tenant))["orders"]
    client = client_of(gateway, "client", agent="buyer-03", wait_s=20)
    big = order(quantity=450, supplier_id="s9")  # 45000 USD: above the approval threshold

    async def approve() -> None:
        queue: list[dict[str, Any]] = []
        while not queue:
            await asyncio.sleep(0.2)
            response = await http.get(
                f"/v1/admin/tenants/{tenant.id}/escalations", headers=gateway.admin
            )
            queue = response.json()["escalations"]
        response = await http.post(
            f"/v1/escalations/{queue[0]['escalation']}/approve", headers=gateway.admin
        )
        assert response.status_code == 201 or response.status_code == 200, response.text

    try:
        outcome, _ = await asyncio.gather(
            client.call("supplier", "POST", "/orders", "call_D", json_body=big), approve()
        )
    finally:
        await client.aclose()
    assert outcome.ok, outcome
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 1


async def test_a_pending_escalation_tells_the_model_to_retry_the_same_call(
    gateway: Gateway,
) -> None:
    client = client_of(gateway, "client", agent="buyer-04", wait_s=0)
    try:
        outcome = await client.call(
            "supplier", "POST", "/orders", "call_E", json_body=order(quantity=450)
        )
    finally:
        await client.aclose()
    assert outcome.reason == "escalated" and outcome.escalation
    assert "Retry this same tool call later" in outcome.text


class Order(BaseModel):
    supplier_id: str
    sku: str
    quantity: int
    unit_price: str


@pytest.mark.parametrize("call_id", ["call_L1", "x" * 400])
async def test_langchain_tool_keys_its_effect_by_the_tool_call_id(
    call_id: str, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = gateway.tenant("client")
    before = (await supplier_stats(upstream, tenant))["orders"]
    client = client_of(gateway, "client", agent="buyer-05")
    tool = http_tool(
        client,
        name="place_order",
        description="Place a purchase order with a supplier.",
        tool="supplier",
        method="POST",
        path="/orders",
        args_schema=Order,
    )
    # The model sees the order's fields, not the injected call id.
    assert set(tool.tool_call_schema.model_json_schema()["properties"]) == set(Order.model_fields)
    call = {"name": "place_order", "args": order(), "id": call_id, "type": "tool_call"}
    try:
        messages = [await tool.ainvoke(call) for _ in range(2)]
    finally:
        await client.aclose()
    assert all(isinstance(m, ToolMessage) for m in messages)
    artifact: Outcome = messages[0].artifact
    assert artifact.ok and messages[0].content == messages[1].content
    assert (await supplier_stats(upstream, tenant))["orders"] == before + 1
    assert len(idempotency_key(call_id)) <= 255
