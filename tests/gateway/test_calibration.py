"""Self-calibrating prices, end to end: a route whose policy says `calibrate` is
priced from the residual factors its settled holds revealed. Settled at twice what
it was priced at, its next price rises to exactly what pricing.calibration computes
for the same evidence (the function the simulator's `irrev-cal` arm calls), in every
worker, without a restart. And, as the simulator prices it, for the route's holds
open at that moment: the more are open, the lower each one's price, exactly as
`route_factor` says for them; as they close, up again."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ledger import Ledger, OpenPool, audit_tenant, pool_tag
from pricing.calibration import (
    TOP_KEPT,
    Evidence,
    Prior,
    factor_ppm,
    hold_factor,
    pooled_pending,
    route_factor,
)
from pricing.models import QuantilePricing
from pricing.money import round_up

from .conftest import Gateway, own_gateway
from .helpers import deploy_hold, effect_headers, order, set_faults
from .servers import Server

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

PRICING = {
    "model": "quantile",
    "recovery": {"alpha": 6, "beta": 2},
    "level": 0.8,
    "calibrate": {"weight": 20, "pending": 1.0},
}
FACE = 100 * 10**6  # small: the settled losses stay within the agent's 10,000 window cap
DEPLOY_ROUTE = {
    "tool": "deploy",
    "route": "POST /deploys",
    "class": "compensable",
    "face_value_fixed": "100",
    "in_process": True,
    "pricing": PRICING,
}
SPEC = QuantilePricing.model_validate(PRICING)


def expected_price(evidence: Evidence) -> int:
    return round_up(FACE, route_factor(SPEC, evidence))


@pytest.fixture
def calibrating_gateway(redis_url: str, suppliers: Server, tmp_path: Path) -> Iterator[Gateway]:
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path,
        2,
        {"routes": [DEPLOY_ROUTE]},
        IRREV_POLICY_CHECK_INTERVAL_S="0.2",
    ) as gateway:
        yield gateway


async def test_settled_at_twice_the_price_the_route_prices_as_calibration_says(
    calibrating_gateway: Gateway,
) -> None:
    tenant = calibrating_gateway.tenant("own")
    keys = iter(range(10_000))

    async with httpx.AsyncClient(base_url=calibrating_gateway.url, trust_env=False) as http:

        async def deploy() -> tuple[str, int]:
            return await deploy_hold(http, tenant, f"d{next(keys)}")

        async def prices_reach(wanted: Callable[[int], bool]) -> int:
            """Six fresh prices in a row, from whichever workers answer, all as wanted."""
            deadline = time.monotonic() + 20
            me = tenant.auth("deployer-01")
            while True:
                prices = []
                for _ in range(6):
                    hold, price = await deploy()
                    prices.append(price)
                    await http.post(f"/v1/holds/{hold}/void", headers=me)
                if all(wanted(price) for price in prices):
                    return prices[-1]
                assert time.monotonic() < deadline, prices
                await asyncio.sleep(0.2)

        # no settlement yet: the catalog's prior, bounded (above the plain 0.8 quantile)
        first = expected_price(Evidence())
        assert first > round_up(FACE, SPEC.model_copy(update={"calibrate": None}).loss_factor())
        assert await prices_reach(lambda p: p == first) == first
        realised = 2 * first
        settled = 12
        for _ in range(settled):
            hold, _ = await deploy()
            reported = await http.post(
                f"/v1/holds/{hold}/settle",
                json={"realised_micros": realised},
                headers=tenant.settler("deploy"),
            )
            assert reported.status_code == 200, reported.text
            # a repeated report teaches nothing more
            again = await http.post(
                f"/v1/holds/{hold}/settle",
                json={"realised_micros": realised},
                headers=tenant.settler("deploy"),
            )
            assert again.status_code == 200, again.text
        ppm = factor_ppm(realised, FACE)
        top = (ppm,) * min(settled, TOP_KEPT)
        evidence = Evidence.from_ppm(settled, settled * ppm, settled * ppm * ppm, top)
        learnt = expected_price(evidence)
        assert learnt > first
        assert await prices_reach(lambda p: p == learnt) == learnt

    # the simulator's path to the same number: its prior and its evidence, factor by
    # factor (float sums, so equal to rounding)
    prior = Prior.from_catalog(6, 2, 0.0, 0.8, 20)
    sim = Evidence()
    for _ in range(settled):
        sim = sim.observe(ppm / 1e6)
    sim_factor = hold_factor(prior, sim, pending=1.0, alpha=1 - 0.8)
    assert math.isclose(sim_factor, route_factor(SPEC, evidence), rel_tol=1e-12)


POOLING = {**PRICING, "calibrate": {"weight": 20, "pending": "live"}}  # as many as are open
POOLING_SPEC = QuantilePricing.model_validate(POOLING)
# Settled residual factors that vary: a route whose settlements agree pools little.
SETTLED_FACTORS = (0.15, 0.25, 0.35)


# A proxied route: its holds are the gateway's own, open while their call is in
# flight, which no agent can release at will (a decision-only route's are priced
# alone and not counted: docs/policy.md, calibrate).
ORDER_ROUTE = {
    "tool": "supplier",
    "route": "POST /orders",
    "class": "compensable",
    "body": ["supplier_id", "sku", "quantity", "unit_price"],
    "face_value": "quantity * unit_price",
    "pricing": POOLING,
}
ORDER = order(quantity=1, unit_price="100")  # a face value of FACE


@pytest.fixture(scope="module")
def pooling_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """One worker (which process prices a hold, and what it last saw, is known), for
    the pooling tests: each has a tenant of its own (`new_tenant`), so that neither
    the evidence one settled nor the holds it left open are another's."""
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path_factory.mktemp("pooling"),
        1,
        None,
        IRREV_POLICY_CHECK_INTERVAL_S="0.2",
        IRREV_UPSTREAM_TIMEOUT_S="30",  # calls held in flight for 10 s
    ) as gateway:
        yield gateway


POOLING_ROUTES = [ORDER_ROUTE, {**DEPLOY_ROUTE, "pricing": POOLING}]


async def test_the_price_follows_the_holds_open_on_the_route(
    pooling_gateway: Gateway, redis_url: str, suppliers: Server
) -> None:
    tenant = pooling_gateway.new_tenant("pool", routes=POOLING_ROUTES)
    keys = iter(range(10_000))
    ppms = [factor_ppm(int(FACE * SETTLED_FACTORS[i % 3]), FACE) for i in range(20)]
    evidence = Evidence.from_ppm(
        len(ppms), sum(ppms), sum(p * p for p in ppms), tuple(sorted(ppms, reverse=True)[:16])
    )

    def price_for(pending: float) -> int:
        return round_up(FACE, route_factor(POOLING_SPEC, evidence, pending))

    ledger = Ledger.from_url(redis_url)
    route = pool_tag("supplier POST /orders")
    async with (
        httpx.AsyncClient(base_url=pooling_gateway.url, trust_env=False, timeout=60) as http,
        httpx.AsyncClient(base_url=suppliers.url, trust_env=False) as upstream,
    ):

        async def buy() -> httpx.Response:
            headers = effect_headers(tenant, "buyer-01", f"p{next(keys)}")
            bought = await http.post("/tools/supplier/orders", json=ORDER, headers=headers)
            assert bought.status_code == 201, bought.text
            return bought

        for ppm in ppms:  # each alone: settled before the next is made
            hold = (await buy()).headers["x-irrev-hold"]
            reported = await http.post(
                f"/v1/holds/{hold}/settle",
                json={"realised_micros": ppm * FACE // 10**6},
                headers=tenant.settler("supplier"),
            )
            assert reported.status_code == 200, reported.text
        deadline = time.monotonic() + 20
        while int((await buy()).headers["x-irrev-price"]) != price_for(1.0):
            assert time.monotonic() < deadline  # until the worker has the evidence
            await asyncio.sleep(0.2)

        # Calls kept in flight one after another (the supplier answers late): the
        # j-th is priced for the j open with it (as its worker saw them after the one
        # before), less one Poisson sd.
        await set_faults(upstream, tenant, delay_s=10.0, times=14)
        calls = []
        for j in range(1, 15):
            calls.append(asyncio.create_task(buy()))
            while (await ledger.open_pools(tenant.id)).get(route, OpenPool()).count < j:
                await asyncio.sleep(0.02)
        prices = [int((await call).headers["x-irrev-price"]) for call in calls]
        expected = [price_for(pooled_pending(float(max(j, 2)))) for j in range(1, 15)]
        assert prices == expected
        assert prices[-1] < prices[0]  # the pool pays: 14 open cost less each than one
        # All closed (posted). The worker still prices for 15, the ledger sends that
        # back, and it prices for the set as it is: this hold alone.
        assert route not in await ledger.open_pools(tenant.id)
        assert int((await buy()).headers["x-irrev-price"]) == price_for(1.0)
        assert route not in await ledger.open_pools(tenant.id)
        report = await audit_tenant(ledger, tenant.id)
        assert report.mismatches == []
    await ledger.aclose()


async def test_an_agent_cannot_pad_the_pool_with_holds_it_voids(
    pooling_gateway: Gateway, redis_url: str
) -> None:
    """review1 F4: a decision-only route's holds are its agent's to void at no cost:
    30 of them opened around a real hold lowered its price 17.5% below its price
    alone. Such a route is priced alone and its holds are not counted."""
    tenant = pooling_gateway.new_tenant("pool", routes=POOLING_ROUTES)
    me = tenant.auth("deployer-01")
    keys = iter(range(10_000))
    ppms = [factor_ppm(int(FACE * SETTLED_FACTORS[i % 3]), FACE) for i in range(20)]
    evidence = Evidence.from_ppm(
        len(ppms), sum(ppms), sum(p * p for p in ppms), tuple(sorted(ppms, reverse=True)[:16])
    )
    alone = round_up(FACE, route_factor(POOLING_SPEC, evidence, 1.0))
    ledger = Ledger.from_url(redis_url)
    async with httpx.AsyncClient(base_url=pooling_gateway.url, trust_env=False) as http:

        async def deploy() -> tuple[str, int]:
            return await deploy_hold(http, tenant, f"p{next(keys)}")

        for ppm in ppms:
            hold, _ = await deploy()
            reported = await http.post(
                f"/v1/holds/{hold}/settle",
                json={"realised_micros": ppm * FACE // 10**6},
                headers=tenant.settler("deploy"),
            )
            assert reported.status_code == 200, reported.text
        deadline = time.monotonic() + 20
        while True:
            hold, price = await deploy()
            await http.post(f"/v1/holds/{hold}/void", headers=me)
            if price == alone:
                break
            assert time.monotonic() < deadline, price
            await asyncio.sleep(0.2)

        padding = [(await deploy())[0] for _ in range(30)]
        real, real_price = await deploy()
        assert await ledger.open_pools(tenant.id) == {}
        for hold in [*padding, real]:
            voided = await http.post(f"/v1/holds/{hold}/void", headers=me)
            assert voided.status_code == 200, voided.text
    await ledger.aclose()
    assert real_price == alone


async def test_an_escalation_is_priced_alone_whatever_is_open_when_it_is_made(
    pooling_gateway: Gateway, redis_url: str, suppliers: Server
) -> None:
    """An escalated hold waits outside its route's open set and joins the set open
    when it is approved, which may be smaller by then. Before, one made while ten
    approved calls were in flight was priced for the set it saw and, approved once they had
    closed, joined a set of one at that price, below its price alone; it is priced
    alone now (the price every set covers), and its approval changes no balance."""
    gw = pooling_gateway
    # A pooling route whose every effect escalates (its threshold is below any
    # price), so that only approved escalations are ever open.
    tenant = gw.new_tenant("threshold-pool", routes=[{**ORDER_ROUTE, "approval_threshold": "1"}])
    keys = iter(range(10_000))
    ppms = [factor_ppm(int(FACE * SETTLED_FACTORS[i % 3]), FACE) for i in range(20)]
    evidence = Evidence.from_ppm(
        len(ppms), sum(ppms), sum(p * p for p in ppms), tuple(sorted(ppms, reverse=True)[:16])
    )
    alone = round_up(FACE, route_factor(POOLING_SPEC, evidence, 1.0))
    assert round_up(FACE, route_factor(POOLING_SPEC, evidence, pooled_pending(10.0))) < alone
    ledger = Ledger.from_url(redis_url)
    route = pool_tag("supplier POST /orders")
    async with (
        httpx.AsyncClient(base_url=gw.url, trust_env=False, timeout=60) as http,
        httpx.AsyncClient(base_url=suppliers.url, trust_env=False) as upstream,
    ):
        rule = await http.post(
            f"/v1/admin/tenants/{tenant.id}/rules",
            json={
                "kind": "auto_approve",
                "agent": "buyer-01",
                "max_price": "1000",
                "duration": "1h",
                "reason": "the fleet's regular buyer",
            },
            headers=gw.admin,
        )
        assert rule.status_code == 201, rule.text

        async def buy(agent: str, status: int) -> httpx.Response:
            headers = effect_headers(tenant, agent, f"e{next(keys)}")
            bought = await http.post("/tools/supplier/orders", json=ORDER, headers=headers)
            assert bought.status_code == status, bought.text
            return bought

        for ppm in ppms:  # approved by the rule, each settled before the next is made
            hold = (await buy("buyer-01", 201)).headers["x-irrev-hold"]
            reported = await http.post(
                f"/v1/holds/{hold}/settle",
                json={"realised_micros": ppm * FACE // 10**6},
                headers=tenant.settler("supplier"),
            )
            assert reported.status_code == 200, reported.text
        deadline = time.monotonic() + 20
        while int((await buy("buyer-01", 201)).headers["x-irrev-price"]) != alone:
            assert time.monotonic() < deadline  # until the worker has the evidence
            await asyncio.sleep(0.2)

        # Ten approved calls kept in flight (the supplier answers late): open.
        await set_faults(upstream, tenant, delay_s=10.0, times=10)
        calls = []
        for j in range(1, 11):  # one after another: each reserve sees the ones before
            calls.append(asyncio.create_task(buy("buyer-01", 201)))
            while (await ledger.open_pools(tenant.id)).get(route, OpenPool()).count < j:
                await asyncio.sleep(0.02)
        # Another agent's escalation, made beside them, waits for a person.
        waiting = await buy("buyer-02", 202)
        assert int(waiting.headers["x-irrev-price"]) == alone
        for call in calls:
            await call
        assert route not in await ledger.open_pools(tenant.id)
        escalation = waiting.json()["escalation"]
        approved = await http.post(
            f"/v1/escalations/{escalation}/approve", json={}, headers=gw.admin
        )
        assert approved.status_code == 201, approved.text
        stored = await ledger.hold(tenant.id, waiting.headers["x-irrev-hold"])
        assert stored is not None and set(stored.amounts.values()) == {alone}
        assert (await audit_tenant(ledger, tenant.id)).mismatches == []
    await ledger.aclose()
