"""One agent cannot bury the approval queue (issue 26): past its `max_escalations`
(default 20) waiting, an effect that would escalate is refused `escalation_cap` and
holds nothing, while other agents' escalations still reach the queue; and the webhook
delivers a page of events round robin across agents, so one agent's burst does not
hold back another's."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.state.webhooks import fair_order

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem, effect_headers, order
from .procurement import flooded_orders
from .servers import Tenant


# One agent floods the approval queue (issue 26): roomy budgets, the default cap.
@pytest.fixture(scope="module")
def flood_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("flood", **flooded_orders())


SMALL = 1  # 100 USD: above the "flood" tenant's 50 USD approval threshold for orders


async def queue(http: httpx.AsyncClient, gateway: Gateway, tenant_id: str) -> list[dict]:
    response = await http.get(
        f"/v1/admin/tenants/{tenant_id}/escalations",
        params={"limit": 200},
        headers=gateway.admin,
    )
    assert response.status_code == 200, response.text
    items: list[dict] = response.json()["escalations"]
    return items


async def test_one_agent_keeps_at_most_its_cap_waiting(
    flood_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = flood_tenant
    # At most 8 at once: below the agent's 16 in flight, whose own refusal
    # (too_many_in_flight) a loaded machine let some of 60 at once meet first.
    at_once = asyncio.Semaphore(8)

    async def send(i: int) -> httpx.Response:
        async with at_once:
            return await http.post(
                "/tools/supplier/orders",
                json=order(quantity=SMALL, sku=f"sku-{i}"),
                headers=effect_headers(tenant, "buyer-05", f"flood-{i}"),
            )

    answers = await asyncio.gather(*(send(i) for i in range(60)))
    statuses = [a.status_code for a in answers]
    assert statuses.count(202) == 20 and statuses.count(429) == 40, statuses
    refusal = assert_problem(
        next(a for a in answers if a.status_code == 429), 429, "escalation_cap"
    )
    assert refusal["max_escalations"] == 20 and refusal["retry"] == "later"
    assert "already has 20 calls waiting" in refusal["detail"]
    # Another agent's escalation still reaches the queue.
    other = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=SMALL),
        headers=effect_headers(tenant, "buyer-06", "other-1"),
    )
    assert other.status_code == 202, other.text
    waiting = await queue(http, gateway, tenant.id)
    by_agent = [item["agent"] for item in waiting]
    assert by_agent.count("buyer-05") == 20 and by_agent.count("buyer-06") == 1
    # Deciding one gives its place back.
    decided = await http.post(
        f"/v1/escalations/{answers[statuses.index(202)].json()['escalation']}/reject",
        headers=gateway.admin,
    )
    assert decided.status_code == 200, decided.text
    again = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=SMALL, sku="sku-again"),
        headers=effect_headers(tenant, "buyer-05", "flood-again"),
    )
    assert again.status_code == 202, again.text


def test_a_page_of_events_is_delivered_round_robin_across_agents() -> None:
    flood: list[tuple[int, dict[str, Any]]] = [(i, {"agent": "loop", "n": i}) for i in range(20)]
    late: list[tuple[int, dict[str, Any]]] = [
        (20, {"agent": "honest", "n": 20}),
        (21, {"type": "rule.set"}),
    ]
    ordered = fair_order(flood + late)
    assert [event.get("agent") for _, event in ordered[:3]] == ["loop", "honest", None]
    # Each agent's own events keep their journal order.
    assert [at for at, event in ordered if event.get("agent") == "loop"] == list(range(20))
    assert sorted(at for at, _ in ordered) == list(range(22))
