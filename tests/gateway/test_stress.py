"""A route's burst detector in the product (issue 28), through two `irrev serve`
processes on one Redis:

- one detector, not one per process: three orders through one gateway and the
  fourth through the other trip it, and the other prices the fourth stressed;
- every order is held at its stressed price (the face value here); one made while
  the detector is off keeps the difference from its calm price as a margin, which
  the sweeper returns once the detector's run it raised has ended calm: a lone calm
  order, and calm orders after a burst, fall to their calm price; a burst's orders
  (its first ones, priced before the detector could see it, and those made while
  it was on) keep the face value;
- an order repeated (the agent retries it, with its key) counts once, through
  either gateway;
- trips and clearings are journaled, and the admin API shows the detector.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from ledger import Ledger, read_journal

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers, order
from .servers import EXAMPLES, Tenant

ROUTE_ID = "supplier POST /orders"
FACE_MICROS = 100 * 10**6  # one bolt at 100 USD
# 0.3 requests/s in calm: the score decays by (4 - 1) x 0.3 = 0.9 a second and each
# order adds ln 4 = 1.39, so a burst of orders sent one after the other trips it
# within a few orders however slow the machine (up to ~1.5 s an order); on for 2 s
# after its last trip. A lone order's run ends within 1.6 s.
FAST = {"calm_rate": 0.3, "warm_up": "60s", "tick": "100ms", "hold": "2s", "shift": 4}
# A decay of 0.06 a second, negligible over a burst however slow the machine: with a
# threshold of 3.5 the 4th order trips it (3 x 1.39 = 4.16 less the decay; 2 x 1.39
# is under it), wherever it is sent.
SLOW = {
    "calm_rate": 0.02,
    "warm_up": "60s",
    "tick": "100ms",
    "hold": "60s",
    "threshold": 3.5,
    "shift": 4,
}
# After the burst: its score (at most 4 + 1.39) is under the threshold after 1.6 s
# and the detector is off 2 s after its last trip; the next order leaves at most
# 5.39 - 2.25 + 1.39 = 4.53, under 4 again a second later.
PAUSE_S, GAP_S = 2.5, 1.0
LOWERED_S = 30.0  # a margin comes back within a sweep of its run's end


def stressed_routes(stress: dict[str, Any]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())[
        "routes"
    ]
    for route in routes:
        if route["route"] == "POST /orders":
            route["stress"] = stress
    return routes


@pytest.fixture(scope="module")
def stress_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("stress", routes=stressed_routes(FAST))


@pytest.fixture(scope="module")
def slow_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("stress-slow", routes=stressed_routes(SLOW))


@pytest.fixture
def repeat_tenant(new_tenant: TenantMaker) -> Tenant:
    """SLOW, and its orders route keyed by content (for an agent that sends no key);
    one per test, each with a detector of its own."""
    routes = stressed_routes(SLOW)
    for route in routes:
        if route["route"] == "POST /orders":
            route["keyless"] = "content"
    return new_tenant("stress-repeat", routes=routes)


@dataclass(frozen=True)
class Bought:
    hold: str
    price: int
    stress: str
    calm: int


def buyer(tenant: Tenant) -> Callable[[httpx.AsyncClient], Awaitable[Bought]]:
    """Orders of one bolt by buyer-01, each with a new key."""
    keys = iter(range(1000))

    async def buy(http: httpx.AsyncClient) -> Bought:
        headers = effect_headers(tenant, "buyer-01", f"s{next(keys)}")
        bought = await http.post("/tools/supplier/orders", json=order(quantity=1), headers=headers)
        assert bought.status_code == 201, bought.text
        h = bought.headers
        calm = int(h.get("x-irrev-calm-price", 0))
        return Bought(h["x-irrev-hold"], int(h["x-irrev-price"]), h["x-irrev-stress"], calm)

    return buy


@asynccontextmanager
async def clients(*gateways: Gateway) -> AsyncIterator[list[httpx.AsyncClient]]:
    hosts = [httpx.AsyncClient(base_url=g.url, trust_env=False, timeout=30) for g in gateways]
    try:
        yield hosts
    finally:
        for http in hosts:
            await http.aclose()


async def charged(ledger: Ledger, tenant: Tenant, bought: Bought) -> int:
    """What the order's hold charges the tenant now: posted on its 201."""
    hold = await ledger.hold(tenant.id, bought.hold)
    assert hold is not None
    return hold.posted[f"tenant:{tenant.id}"] - hold.compensated.get(f"tenant:{tenant.id}", 0)


async def lowered(ledger: Ledger, tenant: Tenant, orders: list[Bought]) -> None:
    """Waits until every one of `orders` charges its calm price."""
    deadline = time.monotonic() + LOWERED_S
    while [await charged(ledger, tenant, b) for b in orders] != [b.calm for b in orders]:
        assert time.monotonic() < deadline, "a margin was not returned after its run ended"
        await asyncio.sleep(0.1)


async def test_the_other_gateway_prices_stressed_at_once(
    slow_tenant: Tenant, gateway: Gateway, peer_gateway: Gateway
) -> None:
    buy = buyer(slow_tenant)
    async with clients(gateway, peer_gateway) as (first, second):
        calm = [await buy(first) for _ in range(3)]
        tripped_by_the_other = await buy(second)
        back_on_the_first = await buy(first)
        shown = await first.get(f"/v1/admin/tenants/{slow_tenant.id}/stress", headers=gateway.admin)
    assert [b.stress for b in calm] == ["margin"] * 3
    assert all(b.price == FACE_MICROS > b.calm > 0 for b in calm)
    # a detector per process would have seen the second gateway's first order only
    assert (tripped_by_the_other.stress, back_on_the_first.stress) == ("on", "on")
    assert tripped_by_the_other.price == back_on_the_first.price == FACE_MICROS
    assert shown.status_code == 200, shown.text
    [detector] = shown.json()["detectors"]
    assert detector["route"] == ROUTE_ID and detector["on"] is True
    assert detector["threshold"] == 3.5 and detector["score"] > 0
    assert detector["last_trip_at"] < detector["on_until"]


async def test_margins_come_back_after_calm_and_stay_on_a_burst(
    stress_tenant: Tenant, gateway: Gateway, peer_gateway: Gateway, redis_url: str
) -> None:
    tenant = stress_tenant
    buy = buyer(tenant)
    ledger = Ledger.from_url(redis_url)
    try:
        async with clients(gateway, peer_gateway) as hosts:
            lone = await buy(hosts[0])
            assert lone.stress == "margin" and lone.price == FACE_MICROS > lone.calm
            await lowered(ledger, tenant, [lone])
            burst = [await buy(hosts[i % 2]) for i in range(10)]
            await asyncio.sleep(PAUSE_S)
            after = [await buy(hosts[0])]
            await asyncio.sleep(GAP_S)
            after.append(await buy(hosts[1]))
            await lowered(ledger, tenant, after)
            shown = await hosts[1].get(
                f"/v1/admin/tenants/{tenant.id}/stress", headers=gateway.admin
            )
        assert [b.stress for b in after] == ["margin"] * 2
        tripped = [b.stress for b in burst].index("on")
        # margins until the 4th order at the earliest, then on to the burst's end, on
        # both gateways; the burst's orders keep the face value (its first ones: their
        # run ended in the trip)
        assert 3 <= tripped <= 8, burst
        assert [b.stress for b in burst] == ["margin"] * tripped + ["on"] * (10 - tripped)
        assert [await charged(ledger, tenant, b) for b in burst] == [FACE_MICROS] * 10
        entries = [e for e in await read_journal(ledger, tenant.id) if e.op == "stress"]
    finally:
        await ledger.aclose()
    assert [(e.fields["route"], e.fields["st"]) for e in entries][:2] == [
        (ROUTE_ID, "on"),
        (ROUTE_ID, "off"),
    ]
    [detector] = shown.json()["detectors"]
    assert detector["on"] is False and detector["on_until"] is None
    assert detector["last_trip_at"] is not None


@pytest.mark.parametrize("keyed", [True, False], ids=["with its key", "without a key"])
async def test_a_repeated_order_counts_once(
    repeat_tenant: Tenant, gateway: Gateway, peer_gateway: Gateway, keyed: bool
) -> None:
    """Six sends of one order through either gateway are one effect, whether the agent
    retries it with its key or sends no key at all (its identical content is the
    key): counted six times, the 4th send would trip the detector (SLOW) and the next
    orders would be priced `on`."""
    one = f"one-order-{keyed}"
    headers = (
        effect_headers(repeat_tenant, "buyer-01", one) if keyed else repeat_tenant.auth("buyer-01")
    )
    async with clients(gateway, peer_gateway) as hosts:
        sent = [
            await hosts[i % 2].post(
                "/tools/supplier/orders", json=order(quantity=1, supplier_id=one), headers=headers
            )
            for i in range(6)
        ]
        buy = buyer(repeat_tenant)
        fresh = [await buy(hosts[0]) for _ in range(2)]
        shown = await hosts[1].get(
            f"/v1/admin/tenants/{repeat_tenant.id}/stress", headers=gateway.admin
        )
    assert [s.status_code for s in sent] == [201] * 6, sent[-1].text
    assert len({s.headers["x-irrev-hold"] for s in sent}) == 1
    assert [s.headers.get("x-irrev-replayed") for s in sent[1:]] == ["true"] * 5
    assert [b.stress for b in fresh] == ["margin", "margin"]
    [detector] = shown.json()["detectors"]
    assert not detector["on"] and detector["last_trip_at"] is None
