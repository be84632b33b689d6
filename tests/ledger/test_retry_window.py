"""Contract 6 under a retry: a reconciler's "not found" voids an ambiguous hold only
past its deadline, in Redis time, and sending the effect again first moves that
deadline past the new request, so the void can never overtake a request on its way."""

from __future__ import annotations

import asyncio

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput, HoldInFlight, HoldNotDue, HoldStateConflict
from ledger.records import HoldState

from .conftest import open_accounts
from .helpers import server_ms, tenant_snapshot
from .test_holds import reserve, used


async def ambiguous_past_its_deadline(ledger: Ledger, tenant: str, key: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, key, 100, "tenant:acme", ttl_ms=1)
    await ledger.mark_ambiguous(tenant, key, "upstream_timeout")
    hold = await ledger.hold(tenant, key)
    assert hold is not None
    while await server_ms(ledger) <= hold.deadline_ms:
        await asyncio.sleep(0.005)


async def test_a_due_only_void_waits_for_the_deadline(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "live", 100, "tenant:acme")
    await ledger.mark_ambiguous(tenant, "live", "upstream_timeout")
    before = await tenant_snapshot(ledger, tenant)
    with pytest.raises(HoldNotDue):
        await ledger.void(tenant, "live", due_only=True)
    assert await tenant_snapshot(ledger, tenant) == before


async def test_a_retry_moves_the_deadline_past_its_request(ledger: Ledger, tenant: str) -> None:
    await ambiguous_past_its_deadline(ledger, tenant, "again")
    await ledger.retry(tenant, "again", window_ms=60_000)
    hold = await ledger.hold(tenant, "again")
    assert hold is not None and hold.deadline_ms > await server_ms(ledger) + 50_000
    with pytest.raises(HoldNotDue):
        await ledger.void(tenant, "again", due_only=True)
    assert await used(ledger, tenant, "tenant:acme") == (100, 0)
    # The send ended ambiguous again, which frees the claim; a shorter retry never
    # pulls the deadline back.
    await ledger.mark_ambiguous(tenant, "again", "upstream_timeout")
    await ledger.retry(tenant, "again", window_ms=1)
    again = await ledger.hold(tenant, "again")
    assert again is not None and again.deadline_ms == hold.deadline_ms
    assert (await audit_tenant(ledger, tenant)).ok


async def test_once_due_the_void_goes_through(ledger: Ledger, tenant: str) -> None:
    await ambiguous_past_its_deadline(ledger, tenant, "gone")
    await ledger.retry(tenant, "gone", window_ms=30)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        try:
            result = await ledger.void(tenant, "gone", due_only=True)
            break
        except HoldNotDue:
            assert loop.time() < deadline, "the retry window never passed"
            await asyncio.sleep(0.01)
    assert result.state is HoldState.VOIDED
    assert await used(ledger, tenant, "tenant:acme") == (0, 0)
    assert (await audit_tenant(ledger, tenant)).ok


async def test_only_an_ambiguous_hold_is_sent_again(ledger: Ledger, tenant: str) -> None:
    await ambiguous_past_its_deadline(ledger, tenant, "settled")
    await ledger.void(tenant, "settled", due_only=True)
    with pytest.raises(HoldStateConflict):
        await ledger.retry(tenant, "settled", window_ms=1000)
    with pytest.raises(BadInput):
        await ledger.retry(tenant, "settled", window_ms=0)


async def test_of_concurrent_retries_one_claims_the_send(ledger: Ledger, tenant: str) -> None:
    """16 repeats of one ambiguous key at once: exactly one may send the effect again;
    the claim ends when that send ends ambiguous again, or lapses."""
    await ambiguous_past_its_deadline(ledger, tenant, "racing")
    outcomes = await asyncio.gather(
        *(ledger.retry(tenant, "racing", window_ms=60_000) for _ in range(16)),
        return_exceptions=True,
    )
    claimed = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, HoldInFlight)]
    assert len(claimed) == 1 and len(refused) == 15
    assert all(0 < o.retry_after_ms <= 60_000 for o in refused)
    await ledger.mark_ambiguous(tenant, "racing", "upstream_timeout")
    await ledger.retry(tenant, "racing", window_ms=30)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:  # a claimer that died: its claim lapses with its window
        try:
            await ledger.retry(tenant, "racing", window_ms=60_000)
            break
        except HoldInFlight:
            assert loop.time() < deadline, "the claim never lapsed"
            await asyncio.sleep(0.01)
    await ledger.post(tenant, "racing", 100)
    hold = await ledger.hold(tenant, "racing")
    assert hold is not None and hold.state is HoldState.POSTED
    with pytest.raises(HoldStateConflict):
        await ledger.retry(tenant, "racing", window_ms=1000)
    assert (await audit_tenant(ledger, tenant)).ok
