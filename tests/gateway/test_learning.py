"""Prices learn from compensation outcomes, end to end: compensations that recover
nothing on a route whose p_fail is a posterior raise that route's next price in
every worker, without a restart; recoveries bring it down again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Gateway, own_gateway
from .helpers import deploy_hold
from .servers import Server

# The in-process deploy route, priced like a reversible effect whose compensation
# (a rollback) fails with p_fail learned from what rollbacks actually did.
DEPLOY_ROUTE = {
    "tool": "deploy",
    "route": "POST /deploys",
    "class": "compensable",
    "face_value_fixed": "1000",
    "in_process": True,
    "pricing": {
        "model": "expected",
        "recovery": {"alpha": 19, "beta": 1},
        "p_fail": {"alpha": 1, "beta": 99, "level": 0.95},
    },
}


@pytest.fixture
def learning_gateway(redis_url: str, suppliers: Server, tmp_path: Path) -> Iterator[Gateway]:
    with own_gateway(
        redis_url,
        suppliers,
        tmp_path,
        2,
        {"routes": [DEPLOY_ROUTE]},
        IRREV_POLICY_CHECK_INTERVAL_S="0.2",
    ) as gateway:
        yield gateway


async def test_rollbacks_that_fail_raise_the_price_and_successes_lower_it(
    learning_gateway: Gateway,
) -> None:
    tenant = learning_gateway.tenant("own")
    me = tenant.auth("deployer-01")
    keys = iter(range(10_000))

    async with httpx.AsyncClient(base_url=learning_gateway.url, trust_env=False) as http:

        async def deploy() -> tuple[str, int]:
            return await deploy_hold(http, tenant, f"d{next(keys)}")

        async def rolled_back(recovered: int) -> None:
            hold, price = await deploy()
            assert (
                await http.post(f"/v1/holds/{hold}/post", json={}, headers=me)
            ).status_code == 200
            # Reported by the tool's settler: an agent's own word teaches nothing.
            back = await http.post(
                f"/v1/holds/{hold}/compensate",
                json={"recovered_micros": min(recovered, price)},
                headers=tenant.settler("deploy"),
            )
            assert back.status_code == 200, back.text

        async def prices_reach(wanted: Callable[[int], bool]) -> int:
            """Six fresh prices in a row, from whichever workers answer, all as wanted:
            every worker has applied the counts (each looks every 0.2 s)."""
            deadline = time.monotonic() + 20
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

        # E[r] = 0.95, p_fail = q_0.95 of Beta(1, 99) = 0.0295: 1000 USD * 0.078
        written = await prices_reach(lambda price: price == pytest.approx(78.3e6, rel=0.01))
        for _ in range(5):
            await rolled_back(recovered=0)  # the rollback recovered nothing
        # Beta(1 + 5, 99): p_fail 0.0984, so 1000 USD * 0.1435
        worse = await prices_reach(lambda price: price == pytest.approx(143.5e6, rel=0.01))
        assert worse > written
        for _ in range(60):
            await rolled_back(recovered=10**9)
        await prices_reach(lambda price: price < worse)
