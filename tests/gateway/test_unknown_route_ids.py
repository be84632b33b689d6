"""An unknown route's id is its path as the forward sends it, percent-encoded: it
is what the escalation queue's `route`, the console's route column, the events feed
and every webhook event print. Decoded, an agent that sent
`/refunds%3Fdry_run=true` was shown as `supplier POST /refunds?dry_run=true`, a dry
run, to approvers and webhook receivers (a chat channel, a pager), while the upstream
got the path segment `refunds%3Fdry_run=true`, a real refund."""

from __future__ import annotations

import httpx
import pytest

from gateway.edge.wire import hold_id_for

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers
from .servers import Tenant


@pytest.fixture(scope="module")
def open_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant(
        "unknown-ids",
        unknown_routes={
            "action": "price_as_irreversible",
            "face_value": "amount",
            "approval_threshold": "10",
        },
    )


async def test_an_unknown_routes_id_never_shows_a_query_the_upstream_does_not_get(
    open_tenant: Tenant, gateway: Gateway
) -> None:
    tenant = open_tenant
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        asked = await http.post(
            "/tools/supplier/refunds%3Fdry_run=true",
            json={"amount": "4000"},
            headers=effect_headers(tenant, "buyer-07", "unknown-id-1"),
        )
        assert asked.status_code == 202, asked.text
        hold = asked.headers["x-irrev-hold"]
        feed = await http.get(
            f"/v1/admin/tenants/{tenant.id}/events", params={"after": "-"}, headers=gateway.admin
        )
        assert feed.status_code == 200, feed.text
    [event] = [e for e in feed.json()["events"] if e.get("hold") == hold]
    # What a webhook receiver prints of the escalation: the path that is sent.
    assert event["route"] == "supplier POST /refunds%3Fdry_run=true", event["route"]
    # The hold's id is derived from the path decoded, as it was before the id was
    # spelled as sent: a repeat of a call made then is the same hold, not a second effect.
    decoded = "supplier POST /refunds?dry_run=true"
    assert hold == hold_id_for(tenant.id, "buyer-07", decoded, "unknown-id-1")
