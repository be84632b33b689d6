"""An agent's escalations waiting at once are bounded by its account's
`max_escalations` (account.lua, reserve.lua): the next one is denied
`escalation_cap` and holds nothing, and every way out of the escalated state
(approve, reject, void, expire) gives its place back; racing processes never let one
more wait (issue 26: one agent made 3,000 escalations in 48 s)."""

from __future__ import annotations

from ledger import AccountSpec, HoldState, Ledger, Reason
from ledger.holds import DAY_MS

from .test_concurrency import finish, release, spawn

HOUR_MS = 3_600_000


async def open_agent(ledger: Ledger, tenant: str, cap: int) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="agent:a1", limit=10**9, soft_limit=10**9, max_escalations=cap)
    )


async def escalate(
    ledger: Ledger, tenant: str, hold: str, escalation_ttl_ms: int = DAY_MS
) -> Reason:
    result = await ledger.reserve(
        tenant,
        hold,
        "fp",
        {"agent:a1": 10},
        ttl_ms=HOUR_MS,
        escalate_above=1,
        escalation_ttl_ms=escalation_ttl_ms,
    )
    return result.reason


async def waiting(ledger: Ledger, tenant: str) -> int:
    return len(await ledger.hold_ids(tenant, HoldState.ESCALATED))


async def test_the_next_escalation_past_the_cap_is_denied_and_holds_nothing(
    ledger: Ledger, tenant: str
) -> None:
    await open_agent(ledger, tenant, 3)
    reasons = [await escalate(ledger, tenant, f"h{i}") for i in range(5)]
    assert reasons == [Reason.APPROVAL_THRESHOLD] * 3 + [Reason.ESCALATION_CAP] * 2
    assert await waiting(ledger, tenant) == 3
    balance = await ledger.balance(tenant, "agent:a1")
    assert balance is not None and balance.pending == 30
    replay = await ledger.reserve(
        tenant, "h3", "fp", {"agent:a1": 10}, ttl_ms=HOUR_MS, escalate_above=1
    )
    assert replay.replayed and replay.reason is Reason.ESCALATION_CAP


async def test_every_way_out_of_the_queue_gives_its_place_back(ledger: Ledger, tenant: str) -> None:
    await open_agent(ledger, tenant, 2)
    assert await escalate(ledger, tenant, "a") is Reason.APPROVAL_THRESHOLD
    assert await escalate(ledger, tenant, "b", escalation_ttl_ms=0) is Reason.APPROVAL_THRESHOLD
    # b is due at once: the next reserve expires it first, and takes its place.
    assert await escalate(ledger, tenant, "c") is Reason.APPROVAL_THRESHOLD
    hold_b = await ledger.hold(tenant, "b")
    assert hold_b is not None and hold_b.state is HoldState.EXPIRED
    assert await escalate(ledger, tenant, "d") is Reason.ESCALATION_CAP
    await ledger.approve(tenant, "a", "alice", ttl_ms=HOUR_MS)
    assert await escalate(ledger, tenant, "e") is Reason.APPROVAL_THRESHOLD
    await ledger.reject(tenant, "e", "alice")
    await ledger.void(tenant, "c")
    assert await escalate(ledger, tenant, "f") is Reason.APPROVAL_THRESHOLD
    assert await escalate(ledger, tenant, "g") is Reason.APPROVAL_THRESHOLD
    assert await escalate(ledger, tenant, "h") is Reason.ESCALATION_CAP
    assert await waiting(ledger, tenant) == 2


async def test_no_cap_means_no_bound(ledger: Ledger, tenant: str) -> None:
    await open_agent(ledger, tenant, 0)
    assert [await escalate(ledger, tenant, f"h{i}") for i in range(4)] == [
        Reason.APPROVAL_THRESHOLD
    ] * 4


async def test_racing_processes_never_let_one_more_wait(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_agent(ledger, tenant, 5)
    processes = [spawn("escalate", redis_url, tenant, f"{tenant}-q", "a1", "10") for _ in range(4)]
    await release(ledger, f"{tenant}-q", len(processes))
    states = [state for result in finish(processes) for state in result["states"]]
    assert states.count("escalated") == 5 and states.count("denied") == 35
    assert await waiting(ledger, tenant) == 5
