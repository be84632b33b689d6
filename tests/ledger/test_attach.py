"""Calls without a key of their own (lua/attach.lua): one content is one effect while
its hold is live or settled within the dedupe window, and a new one after it; racing
repeats of one content, from separate processes, hold once (contract 3 for clients
that send no key)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger import Attached, BadInput, HoldState, Ledger
from ledger.keys import content_key, hold_key
from ledger.replies import decoded

from .conftest import open_accounts
from .test_concurrency import finish, release, spawn

HOUR_MS = 3_600_000
WINDOW_MS = 600_000


def ids(content: str) -> Callable[[int], str]:
    return lambda g: f"{content}-{g}"


async def attach(ledger: Ledger, tenant: str, content: str = "c1") -> Attached:
    return await ledger.attach(
        tenant,
        content,
        ids(content),
        window_ms=WINDOW_MS,
        keep_ms=HOUR_MS,
    )


async def reserve(ledger: Ledger, tenant: str, hold_id: str, price: int = 100) -> HoldState:
    result = await ledger.reserve(tenant, hold_id, "fp", {"tenant:acme": price}, ttl_ms=HOUR_MS)
    return result.state


async def age(ledger: Ledger, tenant: str, hold_id: str, field: str, by_ms: int) -> None:
    """The hold settled `by_ms` earlier than it did (Redis's clock is not ours to move)."""
    key = hold_key(tenant, hold_id)
    ended = int(await decoded(ledger.redis.hget(key, field)))
    await ledger.redis.hset(key, field, str(ended - by_ms))


async def test_a_live_hold_is_attached_to(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    first = await attach(ledger, tenant)
    assert first == Attached("c1-1", 1, existing=False)
    assert await reserve(ledger, tenant, first.hold_id) is HoldState.PENDING
    again = await attach(ledger, tenant)
    assert again == Attached("c1-1", 1, existing=True)
    await ledger.mark_ambiguous(tenant, "c1-1", "upstream_timeout")
    assert await attach(ledger, tenant) == again  # ambiguous: may have happened
    other = await attach(ledger, tenant, "c2")
    assert other == Attached("c2-1", 1, existing=False)


async def test_an_escalation_is_attached_to_until_settled_past_the_window(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    first = await attach(ledger, tenant)
    result = await ledger.reserve(
        tenant, first.hold_id, "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS, escalate_above=50
    )
    assert result.state is HoldState.ESCALATED
    assert (await attach(ledger, tenant)).hold_id == "c1-1"
    await ledger.approve(tenant, "c1-1", "alice", ttl_ms=HOUR_MS)
    await ledger.post(tenant, "c1-1", 100)
    # Approved hours after the first call and paid: a repeat now is that payment.
    assert await attach(ledger, tenant) == Attached("c1-1", 1, existing=True)
    await age(ledger, tenant, "c1-1", "tp", WINDOW_MS + 1000)
    assert await attach(ledger, tenant) == Attached("c1-2", 2, existing=False)


@pytest.mark.parametrize("ending", ["reject", "expire"])
async def test_a_decision_counts_from_when_it_was_made(
    ledger: Ledger, tenant: str, ending: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await ledger.reserve(
        tenant,
        "c1-1",
        "fp",
        {"tenant:acme": 100},
        ttl_ms=HOUR_MS,
        escalate_above=50,
        escalation_ttl_ms=0 if ending == "expire" else HOUR_MS,  # due at once
    )
    if ending == "reject":
        await ledger.reject(tenant, "c1-1", "alice")
    else:
        await ledger.expire(tenant, "c1-1")
    hold = await ledger.hold(tenant, "c1-1")
    assert hold is not None and hold.state is not HoldState.ESCALATED
    assert await attach(ledger, tenant) == Attached("c1-1", 1, existing=True)
    await age(ledger, tenant, "c1-1", "te", WINDOW_MS + 1000)
    assert await attach(ledger, tenant) == Attached("c1-2", 2, existing=False)


async def test_what_did_not_happen_is_decided_again(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    assert await reserve(ledger, tenant, (await attach(ledger, tenant)).hold_id, 5000) is (
        HoldState.DENIED
    )
    second = await attach(ledger, tenant)
    assert second == Attached("c1-2", 2, existing=False)
    assert await reserve(ledger, tenant, second.hold_id, 500) is HoldState.PENDING
    await ledger.void(tenant, second.hold_id)  # refused upstream, or never sent
    assert await attach(ledger, tenant) == Attached("c1-3", 3, existing=False)


async def test_the_index_jumps_to_the_newest_generation(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    for generation in (1, 2, 3):
        found = await attach(ledger, tenant)
        assert found == Attached(f"c1-{generation}", generation, existing=False)
        await reserve(ledger, tenant, found.hold_id)
        await ledger.post(tenant, found.hold_id, 100)
        await age(ledger, tenant, found.hold_id, "tp", WINDOW_MS + 1000)
    # Generation 1's record is gone (trimmed after its retention): the index still says
    # 3 is the newest, so the gap is not taken for a free generation.
    await ledger.redis.delete(hold_key(tenant, "c1-1"))
    assert await ledger.redis.get(content_key(tenant, "c1")) == "3"
    assert await attach(ledger, tenant) == Attached("c1-4", 4, existing=False)
    assert 0 < await ledger.redis.pttl(content_key(tenant, "c1")) <= HOUR_MS


async def test_bad_input_is_refused_before_redis(ledger: Ledger, tenant: str) -> None:
    with pytest.raises(BadInput):
        await ledger.attach(tenant, "c 1", ids("c1"), window_ms=1, keep_ms=1)
    with pytest.raises(BadInput):
        await ledger.attach(tenant, "c1", ids("c1"), window_ms=-1, keep_ms=1)
    with pytest.raises(BadInput):
        await ledger.attach(tenant, "c1", ids("c1"), window_ms=1, keep_ms=0)


async def test_racing_repeats_of_one_content_hold_once(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    count = 6
    processes = [
        spawn("keyless", redis_url, tenant, f"{tenant}-b", "pay", "100") for _ in range(count)
    ]
    await release(ledger, f"{tenant}-b", count)
    results = finish(processes)
    assert {r["hold"] for r in results} == {"pay-1"}
    assert sorted(r["replayed"] for r in results) == [False] + [True] * (count - 1)
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None and balance.pending == 100
