"""Many holds of a tenant read at once (Ledger.holds), as the approval queue reads a
page of them: the same holds as reading each (Ledger.hold), in one round trip,
against a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ledger.client import Ledger
from ledger.records import AccountSpec, Hold, HoldState

HOUR_MS = 3_600_000
WAITING = 40


async def one_by_one(ledger: Ledger, tenant: str, ids: list[str]) -> dict[str, Hold]:
    found = {hold_id: await ledger.hold(tenant, hold_id) for hold_id in ids}
    return {hold_id: hold for hold_id, hold in found.items() if hold is not None}


async def test_a_page_of_holds_is_read_as_each_alone_in_one_round_trip(
    ledger: Ledger, tenant: str, round_trips: Callable[[], int]
) -> None:
    """Issue 31: the queue read its page's holds one round trip each."""
    # A soft limit of 0: every hold escalates.
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=0)
    )
    ids = [f"waiting-{n:02d}" for n in range(WAITING)]
    for n, hold_id in enumerate(ids):
        await ledger.reserve(
            tenant, hold_id, "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS, request=f"R{n}"
        )
    # Decided since the queue listed them: rejected; approved and posted with its answer.
    await ledger.reject(tenant, ids[0], "ann", note="no")
    await ledger.approve(tenant, ids[1], "ann", ttl_ms=HOUR_MS)
    await ledger.post(tenant, ids[1], 10, outcome='{"s": 201}')
    asked = [*reversed(ids), "never-held"]
    expected = await one_by_one(ledger, tenant, asked)
    sent = round_trips()
    found = await ledger.holds(tenant, asked)
    # One for the page; the hold in neither the slot nor the settled index is read
    # again by Ledger.hold, which reads both twice before it calls a hold gone (a
    # restore between two reads moves a hold from the index to the slot).
    assert round_trips() - sent == 3
    assert found == expected and list(found) == list(expected)  # in the order asked
    assert found[ids[2]].state is HoldState.ESCALATED and found[ids[2]].request == "R2"
    assert (found[ids[1]].state, found[ids[1]].outcome) == (HoldState.POSTED, '{"s": 201}')
    assert await ledger.holds(tenant, []) == {}


async def _read_until_settled(
    ledger: Ledger, tenant: str, ids: list[str], reads: list[tuple[str, str, str]]
) -> None:
    while not reads or reads[-1][0] == "pending":
        found = await ledger.holds(tenant, ids)
        reads += [(h.state.value, h.request, h.outcome) for h in found.values()]


async def _post_soon(ledger: Ledger, tenant: str, ids: list[str]) -> None:
    await asyncio.sleep(0)
    for hold_id in ids:
        await ledger.post(tenant, hold_id, 1, outcome="OUTCOME")


async def test_a_batch_read_during_settlements_never_takes_an_outcome_for_a_request(
    ledger: Ledger, tenant: str
) -> None:
    """As `hold`'s reads: whatever settles between them, a live hold never hands out
    its outcome as its request (a hold whose state moved across its reads, a record
    read before a post and its payload after it, is read again on its own)."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=10**9)
    )
    for round_ in range(20):
        ids = [f"race-{round_}-{n}" for n in range(5)]
        for hold_id in ids:
            await ledger.reserve(
                tenant, hold_id, "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS, request="REQUEST"
            )
        reads: list[tuple[str, str, str]] = []
        await asyncio.gather(
            _read_until_settled(ledger, tenant, ids, reads), _post_soon(ledger, tenant, ids)
        )
        for read in reads:
            assert read in (("pending", "REQUEST", ""), ("posted", "", "OUTCOME")), reads
