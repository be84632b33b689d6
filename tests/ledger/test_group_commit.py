"""Group commit (ledger/group.py, _lib.lua's `grouped`): a tenant's concurrent
reserves and posts go as one script call, and each call still gets what it would
have alone: its decision, its error, its replay, in the order the calls came. Against
a real Redis; the crash and contention cases with real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from redis import exceptions as redis_errors

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput, LedgerError
from ledger.journal import read_journal
from ledger.keys import hold_keys, reserve_keys, tenant_keys
from ledger.records import AccountSpec, ReserveRequest, ReserveResult, TransitionResult

from .conftest import open_accounts
from .test_concurrency import kill_mid_storm, release, spawn

HOUR_MS = 3_600_000


def request(hold_id: str, amounts: dict[str, int], fingerprint: str = "fp") -> ReserveRequest:
    return ReserveRequest(
        idempotency_key=hold_id, fingerprint=fingerprint, amounts=amounts, ttl_ms=HOUR_MS
    )


def seen(result: ReserveResult | TransitionResult | LedgerError) -> tuple[Any, ...]:
    """What a caller learns from a result, without the tenant and the clock."""
    if isinstance(result, LedgerError):
        return (type(result).__name__,)
    if isinstance(result, ReserveResult):
        return (result.decision, result.reason, result.state, result.replayed)
    return (result.status, result.state, tuple(sorted(result.flags)))


async def open_tenant(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=100, agent_a=60)
    await ledger.upsert_account(
        tenant, AccountSpec(account="principal:ops", limit=1000, soft_limit=50)
    )


def mixed_batch() -> list[ReserveRequest]:
    """Admissions, a denial once the agent is full, a soft-band escalation, a replay
    and a conflicting replay of a call earlier in the same batch, an unknown account."""
    agent = {"tenant:acme": 20, "agent:a": 20}
    return [
        request("h1", agent),
        request("h2", agent),
        request("h1", agent),
        request("h1", agent, fingerprint="other"),
        request("h3", agent),
        request("h4", agent),
        request("h5", {"principal:ops": 60}),
        request("h6", {"agent:nobody": 1}),
        request("h7", {"tenant:acme": 10}),
    ]


async def test_a_group_decides_every_call_as_the_calls_alone_do(
    ledger: Ledger, tenant: str
) -> None:
    alone_tenant = f"{tenant}-alone"
    for owner in (tenant, alone_tenant):
        await open_tenant(ledger, owner)
    grouped = await ledger.reserve_many(tenant, mixed_batch(), grouped=True)
    alone = await ledger.reserve_many(alone_tenant, mixed_batch())
    assert [seen(r) for r in grouped] == [seen(r) for r in alone]
    assert [seen(r) for r in grouped][:4] == [
        ("admit", "within_budget", "pending", False),
        ("admit", "within_budget", "pending", False),
        ("admit", "within_budget", "pending", True),
        ("IdempotencyConflict",),
    ]
    assert seen(grouped[5])[:2] == ("deny", "budget_exceeded")
    assert seen(grouped[6])[:2] == ("escalate", "soft_band")
    assert seen(grouped[7]) == ("UnknownAccount",)

    posts = [("h1", 15), ("h2", 30), ("h1", 15), ("nope", 1), ("h4", 5)]
    grouped_posts = await ledger.post_many(tenant, posts, grouped=True)
    alone_posts = await ledger.post_many(alone_tenant, posts)
    assert [seen(r) for r in grouped_posts] == [seen(r) for r in alone_posts]
    assert seen(grouped_posts[1]) == ("ok", "posted", ("overrun",))  # posted and flagged
    assert seen(grouped_posts[2])[0] == "exists"
    assert seen(grouped_posts[3]) == ("HoldNotFound",)

    def balances(found: Iterable[Any]) -> dict[str, tuple[int, int]]:
        return {b.account: (b.pending, b.posted) for b in found}

    assert balances(await ledger.balances(tenant)) == balances(await ledger.balances(alone_tenant))
    journals = [
        [(e.op, e.fields.get("hold"), e.fields.get("why")) for e in await read_journal(ledger, o)]
        for o in (tenant, alone_tenant)
    ]
    assert journals[0] == journals[1]
    for owner in (tenant, alone_tenant):
        assert (await audit_tenant(ledger, owner)).mismatches == []


async def test_a_group_naming_another_tenants_key_writes_nothing(
    ledger: Ledger, tenant: str
) -> None:
    """The group binds every call's keys before the first call runs: one pointed at
    another tenant fails the group before anything is written."""
    await open_tenant(ledger, tenant)
    await ledger.load_scripts()
    first = ledger.reserve_args(request("g1", {"tenant:acme": 5}), batched=True)
    second = ledger.reserve_args(request("g2", {"tenant:acme": 5}), batched=True)
    victim = f"{tenant}-victim"
    keys = [
        *tenant_keys(tenant),
        *reserve_keys(tenant, "g1")[5:],
        *hold_keys(victim, "g2"),
        reserve_keys(tenant, "g2")[7],
    ]
    args = ["2", "3", str(len(first)), "3", str(len(second)), *first, *second]
    # A cluster refuses the keys of two slots before the script runs.
    refused = (redis_errors.ResponseError, redis_errors.RedisClusterException)
    with pytest.raises(refused, match=r"must be a key of the tenant|CROSSSLOT|slot"):
        await ledger._scripts.call("reserve_group", keys, args)
    assert await ledger.hold(tenant, "g1") is None
    assert {e.op for e in await read_journal(ledger, tenant)} == {"account"}


async def test_concurrent_reserves_go_in_groups_and_never_overdraw(
    redis_url: str, tenant: str, round_trips: Callable[[], int]
) -> None:
    """200 concurrent reserves of one tenant, 40 of them repeats of another's key:
    fewer sends than calls, exactly the admissions the limit allows, one hold per key."""
    ledger = Ledger.from_url(redis_url, group_wait_ms=1)
    try:
        await open_accounts(ledger, tenant, tenant_acme=7 * 100)
        await ledger.load_scripts()
        before = round_trips()
        keys = [f"k{i}" for i in range(160)] + [f"k{i}" for i in range(40)]
        results = await asyncio.gather(
            *(ledger.reserve(tenant, k, "fp", {"tenant:acme": 7}, ttl_ms=HOUR_MS) for k in keys)
        )
        sends = round_trips() - before
        fresh = [r for r in results if not r.replayed]
        assert len(fresh) == 160
        assert sum(r.decision == "admit" for r in fresh) == 100
        for key, result in zip(keys[160:], results[160:], strict=True):
            first = results[keys.index(key)]
            assert (result.decision, result.reason) == (first.decision, first.reason)
        balance = await ledger.balance(tenant, "tenant:acme")
        assert balance is not None and balance.pending == 700
        assert sends < len(keys) / 4
        admitted = [
            k for k, r in zip(keys[:160], results[:160], strict=True) if r.decision == "admit"
        ]
        posts = await asyncio.gather(*(ledger.post(tenant, k, 3) for k in admitted * 2))
        assert sorted(p.status for p in posts) == ["exists"] * 100 + ["ok"] * 100
        balance = await ledger.balance(tenant, "tenant:acme")
        assert balance is not None and (balance.pending, balance.posted) == (0, 300)
        assert (await audit_tenant(ledger, tenant)).mismatches == []
    finally:
        await ledger.aclose()


async def test_a_call_cancelled_while_it_waits_is_never_sent(redis_url: str, tenant: str) -> None:
    ledger = Ledger.from_url(redis_url, group_wait_ms=10)
    try:
        await open_accounts(ledger, tenant, tenant_acme=100)
        await ledger.load_scripts()
        amounts = {"tenant:acme": 5}
        first = asyncio.create_task(ledger.reserve(tenant, "first", "fp", amounts, ttl_ms=HOUR_MS))
        await asyncio.sleep(0)  # `first` is in flight, alone
        waiting = asyncio.create_task(ledger.reserve(tenant, "gone", "fp", amounts, ttl_ms=HOUR_MS))
        await asyncio.sleep(0)  # `gone` waits for the next group
        waiting.cancel()
        assert (await first).decision == "admit"
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # A later call goes after any group still to leave: had `gone` stayed queued,
        # it would have been sent by the time this one is answered.
        await ledger.reserve(tenant, "after", "fp", amounts, ttl_ms=HOUR_MS)
        assert await ledger.hold(tenant, "gone") is None
    finally:
        await ledger.aclose()


async def test_a_bad_call_is_refused_alone(redis_url: str, tenant: str) -> None:
    """Input errors are raised to their own caller before grouping: the calls beside
    it are decided."""
    ledger = Ledger.from_url(redis_url, group_wait_ms=5)
    try:
        await open_accounts(ledger, tenant, tenant_acme=100)
        calls = [
            ledger.reserve(tenant, f"ok{i}", "fp", {"tenant:acme": 5}, ttl_ms=HOUR_MS)
            for i in range(5)
        ]
        bad = ledger.reserve(tenant, "bad", "fp", {"tenant:acme": -5}, ttl_ms=HOUR_MS)
        results = await asyncio.gather(*calls, bad, return_exceptions=True)
        assert isinstance(results[-1], BadInput)
        assert all(isinstance(r, ReserveResult) and r.decision == "admit" for r in results[:-1])
    finally:
        await ledger.aclose()


async def test_due_holds_are_released_before_a_group_decides(redis_url: str, tenant: str) -> None:
    """A group's calls that need the room of holds past their deadline are sent back,
    the holds expired, and the calls decided again in their order: admitted."""
    ledger = Ledger.from_url(redis_url, group_wait_ms=5)
    try:
        await open_accounts(ledger, tenant, tenant_acme=30)
        old = [
            await ledger.reserve(
                tenant, f"old{i}", "fp", {"tenant:acme": 10}, ttl_ms=1, armed=False
            )
            for i in range(3)
        ]
        while await ledger.now_ms() <= max(r.deadline_ms for r in old):  # Redis's clock
            await asyncio.sleep(0.001)
        results = await asyncio.gather(
            *(
                ledger.reserve(tenant, f"new{i}", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS)
                for i in range(4)
            )
        )
        assert [r.decision for r in results] == ["admit", "admit", "admit", "deny"]
    finally:
        await ledger.aclose()


async def test_a_sigkilled_grouping_client_leaves_every_hold_whole(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """Processes reserving and posting 16 at a time in groups, one SIGKILLed mid-flood:
    no partial hold, no partial group, the audit clean; the victim's reserves sent
    again are replays of what Redis kept, never a second hold."""
    await open_accounts(ledger, tenant, tenant_acme=10**9)
    for p in range(3):
        await open_accounts(ledger, tenant, **{f"agent_g{p}": 10**9})
    name = f"{tenant}:barrier"
    workers = [
        spawn("--group-ms", "1", "grouped", redis_url, tenant, name, f"g{p}", "20000")
        for p in range(3)
    ]
    await release(ledger, name, len(workers))
    kill_mid_storm(workers, 400)

    report = await audit_tenant(ledger, tenant)
    assert report.mismatches == []
    assert report.entries > 400
    kept = [
        hold_id
        for hold_id in (f"g0-{i}" for i in range(2000))
        if await ledger.hold(tenant, hold_id) is not None
    ]
    assert len(kept) >= 400
    again = await ledger.reserve_many(
        tenant, [request(k, {"tenant:acme": 4, "agent:g0": 4}) for k in kept]
    )
    assert all(isinstance(r, ReserveResult) and r.replayed for r in again)
    assert (await audit_tenant(ledger, tenant)).mismatches == []
