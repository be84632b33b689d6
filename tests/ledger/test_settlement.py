"""Settlement in the ledger's own scripts: no amount takes a balance past 2^53-1
(the audit's exact replay depends on it), true-up sets a posted hold's net charge,
and a route learns at most one outcome per hold."""

from __future__ import annotations

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput, HoldNotFound, HoldStateConflict
from ledger.keys import hold_key, observed_key
from ledger.limits import MAX_AMOUNT
from ledger.records import HoldState, Status

from .conftest import open_accounts
from .helpers import tenant_snapshot
from .test_holds import reserve, used

MAX = MAX_AMOUNT
ROUTE = "deploy POST /deploys"


async def test_a_post_past_2_53_is_refused_before_any_write(ledger: Ledger, tenant: str) -> None:
    """Observation 3: one post of 2^53-1 next to another charge took the Lua sum past
    2^53, where doubles stop being exact, and the audit's replay disagreed."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    await reserve(ledger, tenant, "k2", 400, "tenant:acme")
    await ledger.post(tenant, "k1", MAX - 1000)
    before = await tenant_snapshot(ledger, tenant)
    with pytest.raises(BadInput) as caught:
        await ledger.post(tenant, "k2", 2000)
    assert caught.value.field == "amount"
    assert await tenant_snapshot(ledger, tenant) == before
    with pytest.raises(BadInput):
        await ledger.true_up(tenant, "k1", MAX)
    assert await tenant_snapshot(ledger, tenant) == before
    assert (await audit_tenant(ledger, tenant)).ok


async def test_true_up_returns_the_rest_and_posts_an_overrun(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    with pytest.raises(HoldStateConflict):
        await ledger.true_up(tenant, "k1", 100)  # not posted yet
    await ledger.post(tenant, "k1", 400)

    down = await ledger.true_up(tenant, "k1", 150)
    assert (down.status, down.state, down.flags) == (Status.OK, HoldState.POSTED, frozenset())
    assert await used(ledger, tenant, "tenant:acme") == (0, 150)
    assert (await ledger.true_up(tenant, "k1", 150)).status is Status.EXISTS
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None
    assert (hold.posted, hold.compensated) == ({"tenant:acme": 400}, {"tenant:acme": 250})

    up = await ledger.true_up(tenant, "k1", 600)
    assert up.flags == {"overrun"}
    assert await used(ledger, tenant, "tenant:acme") == (0, 600)
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None
    assert (hold.posted, hold.compensated) == ({"tenant:acme": 600}, {"tenant:acme": 0})
    assert "overrun" in hold.flags
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None and balance.overruns == 1

    await ledger.true_up(tenant, "k1", 0)
    assert await used(ledger, tenant, "tenant:acme") == (0, 0)
    assert (await audit_tenant(ledger, tenant)).ok


async def test_a_hold_teaches_its_route_once(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    with pytest.raises(HoldStateConflict):
        await ledger.learn(tenant, "k1", ROUTE, failed=True)
    await ledger.post(tenant, "k1", 400)
    assert await ledger.learn(tenant, "k1", ROUTE, failed=True)
    for failed in (True, False, True):
        assert not await ledger.learn(tenant, "k1", ROUTE, failed=failed)
    assert await ledger.redis.hget(observed_key(tenant, "failures"), ROUTE) == "1"
    assert await ledger.redis.hget(observed_key(tenant, "successes"), ROUTE) is None
    with pytest.raises(HoldNotFound):
        await ledger.learn(tenant, "nope", ROUTE, failed=True)
    assert not await ledger.redis.exists(hold_key(tenant, "nope"))


async def test_a_hold_records_its_factor_once_and_the_route_keeps_the_largest(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10**6)
    await reserve(ledger, tenant, "k0", 400, "tenant:acme")
    with pytest.raises(HoldStateConflict):
        await ledger.calibrate(tenant, "k0", ROUTE, 500_000, keep=3)
    factors = [500_000, 1_000_000, 0, 250_000, 750_000]
    for i, ppm in enumerate(factors):
        hold = f"k{i}"
        if i:
            await reserve(ledger, tenant, hold, 400, "tenant:acme")
        await ledger.post(tenant, hold, 400)
        assert await ledger.calibrate(tenant, hold, ROUTE, ppm, keep=3)
        assert not await ledger.calibrate(tenant, hold, ROUTE, 999_999, keep=3)
    seen = (await ledger.settled_factors([tenant]))[tenant][ROUTE]
    assert (seen.n, seen.total_ppm) == (5, sum(factors))
    assert seen.total_sq_ppm == sum(f * f for f in factors)
    assert seen.top_ppm == (1_000_000, 750_000, 500_000)
    with pytest.raises(BadInput):
        await ledger.calibrate(tenant, "k1", ROUTE, 1_000_001, keep=3)
