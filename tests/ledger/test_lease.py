"""The lease (ledger/lease.py): one holder at a time, renewed only by its holder,
free again once released or lapsed; on every server, the cluster included."""

from __future__ import annotations

import asyncio

from ledger import Ledger


async def test_one_holder_at_a_time(ledger: Ledger, tenant: str) -> None:
    first, second = ledger.lease(tenant, "sweep", 60_000), ledger.lease(tenant, "sweep", 60_000)
    assert await first.hold()
    assert not await second.hold()
    assert first.held and not second.held
    assert await first.hold()  # renewed by its holder
    assert await second.holder() == first.token


async def test_a_released_lease_is_free_for_the_next(ledger: Ledger, tenant: str) -> None:
    first, second = ledger.lease(tenant, "sweep", 60_000), ledger.lease(tenant, "sweep", 60_000)
    assert await first.hold()
    assert not await second.release()  # only the holder frees it
    assert await first.release()
    assert not first.held
    assert await second.hold()
    assert not await first.hold()


async def test_a_lapsed_lease_goes_to_whoever_asks(ledger: Ledger, tenant: str) -> None:
    # Long enough that `held` (0.8 of it, from when the call left) survives a loaded
    # machine's round trip; the lapse itself is Redis's.
    first, second = ledger.lease(tenant, "sweep", 2_000), ledger.lease(tenant, "sweep", 60_000)
    assert await first.hold()
    assert await second.holder() == first.token
    while await second.holder() is not None:
        await asyncio.sleep(0.1)
    assert await second.hold()
    assert not await first.hold()  # its former holder cannot renew what it lost


async def test_leases_of_other_work_or_tenants_are_apart(ledger: Ledger, tenant: str) -> None:
    assert await ledger.lease(tenant, "sweep", 60_000).hold()
    assert await ledger.lease(tenant, "events", 60_000).hold()
    assert await ledger.lease(tenant + "-other", "sweep", 60_000).hold()
