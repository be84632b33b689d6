"""The account that really tripped (issue 26): after a raise_limit rule, the approval
queue names the account whose soft band escalated the hold, by the limits the reserve
counted (the raise included), and shows the threshold and limit in force, as the
balances do. Before, it compared the soft limit without the raise: it named a raised
account that was well under its band, with its old threshold."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .conftest import Gateway, TenantMaker
from .helpers import balances, effect_headers, order
from .servers import Tenant


@pytest.fixture(scope="module")
def tripped_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("tripped")


QUANTITY = 300  # 30,000 USD of face value, priced under the route's 30,000 USD threshold


async def buy(http: httpx.AsyncClient, tenant: Tenant, agent: str, supplier: str, key: str) -> Any:
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=QUANTITY, supplier_id=supplier),
        headers=effect_headers(tenant, agent, key),
    )
    assert response.status_code in (201, 202), response.text
    return response


async def queued(
    tenant: Tenant, http: httpx.AsyncClient, gateway: Gateway, escalation: str
) -> dict[str, Any]:
    queue = await http.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gateway.admin)
    assert queue.status_code == 200, queue.text
    [item] = [i for i in queue.json()["escalations"] if i["escalation"] == escalation]
    return item


async def test_after_a_raise_the_queue_names_the_account_that_tripped(
    tripped_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = tripped_tenant
    # facilities: 60,000 USD, soft band from 48,000; raised to 120,000, band from 108,000.
    raised = await http.post(
        f"/v1/admin/tenants/{tenant.id}/rules",
        json={
            "kind": "raise_limit",
            "account": "principal:facilities",
            "amount": "60000",
            "duration": "1h",
            "reason": "quarter-end",
        },
        headers=gateway.admin,
    )
    assert raised.status_code == 201, raised.text

    # Facilities' agents buy from one supplier (100,000 USD, band from 80,000) until
    # it escalates: by then facilities is past 48,000 but well under 108,000.
    supplier = f"s-trip-{tenant.id}"
    agents = ["buyer-41", "buyer-42", "buyer-43", "buyer-44", "buyer-45"]
    for n, agent in enumerate(agents):
        answer = await buy(http, tenant, agent, supplier, f"trip-{n}")
        if answer.status_code == 202:
            break
    assert answer.status_code == 202, "the supplier's soft band never escalated"
    rows = await balances(http, gateway.admin, tenant)
    facilities = rows["principal:facilities"]
    assert 48_000 * 10**6 < facilities["pending"] + facilities["posted"] < 108_000 * 10**6

    item = await queued(tenant, http, gateway, answer.json()["escalation"])
    assert item["reason"] == "soft_band"
    trip = item["tripped"]
    assert trip["account"] == f"factor:supplier:{supplier}", trip
    assert (trip["threshold_text"], trip["limit_text"]) == ("80,000 USD", "100,000 USD")

    # The raised account itself past its raised band: named, with its band and limit in
    # force (the balances' effective limit).
    answer = await buy(http, tenant, "buyer-46", f"{supplier}-2", "trip-raised")
    assert answer.status_code == 202, answer.text
    item = await queued(tenant, http, gateway, answer.json()["escalation"])
    trip = item["tripped"]
    assert trip["account"] == "principal:facilities", trip
    assert (trip["threshold_text"], trip["limit_text"]) == ("108,000 USD", "120,000 USD")
    rows = await balances(http, gateway.admin, tenant)
    assert rows["principal:facilities"]["effective_limit"] == trip["limit"]
