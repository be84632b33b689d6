"""No account sprawl (issue 26): 300 payments of 0.000001 USD to new payees opened 300
lasting accounts. Amounts below the tenant's smallest amount are refused; one agent
opens at most `max_new_accounts` risk-factor accounts a window; and the gateway's
sweeper closes the ones that held nothing since their window ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Gateway, own_gateway
from .helpers import balances, effect_headers, order
from .servers import Server

# A gateway of its own and a budget window to outlive (~12 s): .ci/run's slow pass.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sprawl(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("sprawl")
    policy = {"window": "3s", "max_new_accounts": 30}
    with own_gateway(
        redis_url,
        suppliers,
        root,
        1,
        policy,
        IRREV_SWEEP_INTERVAL_S="0.2",
        IRREV_ACCOUNT_CLOSE_INTERVAL_S="0.2",
    ) as gateway:
        yield gateway


@pytest.fixture
async def client(sprawl: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sprawl.url, timeout=30, trust_env=False) as c:
        yield c


async def supplier_accounts(client: httpx.AsyncClient, gateway: Gateway) -> set[str]:
    rows = await balances(client, gateway.admin, gateway.tenant("own"))
    return {account for account in rows if account.startswith("factor:supplier:")}


async def test_micro_payments_to_new_payees_leave_no_lasting_accounts(
    sprawl: Gateway, client: httpx.AsyncClient
) -> None:
    tenant = sprawl.tenant("own")
    micro = [
        await client.post(
            "/tools/supplier/orders",
            json=order(quantity=1, unit_price="0.000001", supplier_id=f"micro-{i}"),
            headers=effect_headers(tenant, "buyer-01", f"micro-{i}"),
        )
        for i in range(300)
    ]
    assert {r.status_code for r in micro} == {422}
    assert {r.json()["reason"] for r in micro} == {"bad_amount"}
    assert "below the smallest amount" in micro[0].json()["detail"]
    small = [
        await client.post(
            "/tools/supplier/orders",
            json=order(quantity=1, unit_price="0.01", supplier_id=f"new-{i}"),
            headers=effect_headers(tenant, "buyer-02", f"new-{i}"),
        )
        for i in range(300)
    ]
    statuses = [r.status_code for r in small]
    # The window (3 s) may renew during the run: at most 30 opened in each.
    assert statuses.count(201) >= 30 and {
        r.json()["reason"] for r in small if r.status_code == 429
    } <= {"account_cap"}, statuses
    opened = await supplier_accounts(client, sprawl)
    assert 0 < len(opened) <= 30 * 3
    # Their window over and nothing held since: the sweeper closes them.
    deadline = asyncio.get_running_loop().time() + 20
    while await supplier_accounts(client, sprawl):
        assert asyncio.get_running_loop().time() < deadline, "idle accounts were not closed"
        await asyncio.sleep(0.2)
    metrics = (await client.get("/metrics", headers=sprawl.admin)).text
    assert f'irrev_accounts_closed_total{{tenant="{tenant.id}"}}' in metrics
