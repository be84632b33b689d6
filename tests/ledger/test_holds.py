"""Reserve and the hold lifecycle against a real Redis: decisions, all-or-nothing,
idempotency, settlement, escalation and expiry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ledger.client import Ledger
from ledger.errors import HoldNotDue, HoldNotFound, HoldStateConflict, IdempotencyConflict
from ledger.keys import hold_key, payload_key
from ledger.records import AccountSpec, HoldState, Reason, ReserveResult, Status, Verdict

from .conftest import open_accounts
from .helpers import server_ms, stored_hold

HOUR_MS = 3_600_000


async def reserve(
    ledger: Ledger, tenant: str, key: str, price: int, *accounts: str, **kw: Any
) -> ReserveResult:
    """A reserve of `price` on each of `accounts`; `kw` as Ledger.reserve takes them."""
    return await ledger.reserve(
        tenant,
        key,
        kw.pop("fingerprint", "fp"),
        {a: price for a in accounts},
        ttl_ms=kw.pop("ttl_ms", HOUR_MS),
        **kw,
    )


async def used(ledger: Ledger, tenant: str, account: str) -> tuple[int, int]:
    balance = await ledger.balance(tenant, account)
    assert balance is not None
    return balance.pending, balance.posted


async def test_admit_holds_price_on_every_account(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000, agent_a=500)
    result = await reserve(ledger, tenant, "k1", 300, "tenant:acme", "agent:a")
    assert (result.decision, result.reason, result.state) == (
        Verdict.ADMIT,
        Reason.WITHIN_BUDGET,
        HoldState.PENDING,
    )
    assert [(c.account, c.limit, c.used, c.amount) for c in result.accounts] == [
        ("tenant:acme", 1000, 0, 300),
        ("agent:a", 500, 0, 300),
    ]
    assert result.remaining == 200
    assert await used(ledger, tenant, "tenant:acme") == (300, 0)
    assert await used(ledger, tenant, "agent:a") == (300, 0)


async def test_all_or_nothing_when_tenant_account_does_not_fit(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=250, agent_a=1000, agent_b=1000)
    assert (await reserve(ledger, tenant, "k1", 200, "tenant:acme", "agent:a")).decision == "admit"
    result = await reserve(ledger, tenant, "k2", 100, "agent:b", "tenant:acme")
    assert (result.decision, result.reason) == (Verdict.DENY, Reason.BUDGET_EXCEEDED)
    assert result.binding.account == "tenant:acme"
    assert result.binding.available == 50
    assert await used(ledger, tenant, "agent:b") == (0, 0)
    assert await used(ledger, tenant, "tenant:acme") == (200, 0)
    hold = await ledger.hold(tenant, "k2")
    assert hold is not None and hold.state is HoldState.DENIED


async def test_replay_returns_original_and_changes_nothing(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    first = await reserve(ledger, tenant, "k1", 600, "tenant:acme")
    again = await reserve(ledger, tenant, "k1", 600, "tenant:acme")
    assert again.status is Status.EXISTS and again.replayed
    assert (again.decision, again.accounts, again.deadline_ms) == (
        first.decision,
        first.accounts,
        first.deadline_ms,
    )
    assert await used(ledger, tenant, "tenant:acme") == (600, 0)
    # A denial replays as the same denial even once budget is free again.
    denied = await reserve(ledger, tenant, "k2", 600, "tenant:acme")
    await ledger.void(tenant, "k1")
    replay = await reserve(ledger, tenant, "k2", 600, "tenant:acme")
    assert denied.decision is replay.decision is Verdict.DENY
    assert await used(ledger, tenant, "tenant:acme") == (0, 0)


async def test_same_key_different_request_is_a_conflict(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 100, "tenant:acme", fingerprint="a")
    with pytest.raises(IdempotencyConflict) as caught:
        await reserve(ledger, tenant, "k1", 900, "tenant:acme", fingerprint="b")
    assert caught.value.state is HoldState.PENDING
    assert await used(ledger, tenant, "tenant:acme") == (100, 0)


async def test_soft_band_and_approval_threshold_escalate(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=800)
    )
    await ledger.upsert_account(
        tenant, AccountSpec(account="agent:a", limit=1000, soft_limit=1000, approval_threshold=300)
    )
    assert (await reserve(ledger, tenant, "k1", 700, "tenant:acme")).decision == "admit"
    band = await reserve(ledger, tenant, "k2", 200, "tenant:acme")
    assert (band.decision, band.reason, band.state) == (
        Verdict.ESCALATE,
        Reason.SOFT_BAND,
        HoldState.ESCALATED,
    )
    big = await reserve(ledger, tenant, "k3", 301, "agent:a")
    assert big.reason is Reason.APPROVAL_THRESHOLD
    route = await reserve(ledger, tenant, "k4", 51, "agent:a", escalate_above=50)
    assert route.reason is Reason.APPROVAL_THRESHOLD
    # Escalations hold their budget, so approving them can never overdraw.
    assert await used(ledger, tenant, "tenant:acme") == (900, 0)
    assert await ledger.hold_ids(tenant, HoldState.ESCALATED) == ["k2", "k3", "k4"]


async def test_post_releases_the_rest_and_flags_overruns(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    await reserve(ledger, tenant, "k2", 400, "tenant:acme")
    under = await ledger.post(tenant, "k1", 150)
    assert (under.state, under.flags) == (HoldState.POSTED, frozenset())
    over = await ledger.post(tenant, "k2", 900)
    assert over.flags == {"overrun"}
    assert await used(ledger, tenant, "tenant:acme") == (0, 1050)
    # Over the limit now: every admission is blocked, even a free one.
    blocked = await reserve(ledger, tenant, "k3", 0, "tenant:acme")
    assert (blocked.decision, blocked.reason) == (Verdict.DENY, Reason.OVER_LIMIT)
    # Recovery brings it back under the limit and admissions resume.
    await ledger.compensate(tenant, "k2", 500)
    assert await used(ledger, tenant, "tenant:acme") == (0, 550)
    assert (await reserve(ledger, tenant, "k4", 450, "tenant:acme")).decision == "admit"


async def test_post_is_idempotent_and_amount_conflicts(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    await ledger.post(tenant, "k1", 300)
    assert (await ledger.post(tenant, "k1", 300)).status is Status.EXISTS
    with pytest.raises(IdempotencyConflict):
        await ledger.post(tenant, "k1", 301)
    with pytest.raises(HoldStateConflict) as caught:
        await ledger.void(tenant, "k1")
    assert caught.value.state is HoldState.POSTED
    assert await used(ledger, tenant, "tenant:acme") == (0, 300)


async def test_post_per_account_amounts(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000, factor_s=1000)
    await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 400, "factor:s": 200}, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "k1", {"factor:s": 250, "tenant:acme": 100})
    assert await used(ledger, tenant, "tenant:acme") == (0, 100)
    assert await used(ledger, tenant, "factor:s") == (0, 250)
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None and hold.posted == {"tenant:acme": 100, "factor:s": 250}
    assert hold.flags == {"overrun"}


async def test_ambiguous_stays_charged_until_reconciled(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "k1", 400, "tenant:acme")
    await reserve(ledger, tenant, "k2", 400, "tenant:acme")
    await ledger.mark_ambiguous(tenant, "k1", "upstream_timeout")
    await ledger.mark_ambiguous(tenant, "k2", "upstream_5xx")
    assert await ledger.hold_ids(tenant, HoldState.AMBIGUOUS) == ["k1", "k2"]
    assert await used(ledger, tenant, "tenant:acme") == (800, 0)
    with pytest.raises(HoldStateConflict):
        await ledger.expire(tenant, "k1")
    await ledger.post(tenant, "k1", 400)
    await ledger.void(tenant, "k2")
    assert await used(ledger, tenant, "tenant:acme") == (0, 400)
    assert await ledger.hold_ids(tenant, HoldState.AMBIGUOUS) == []


async def test_approve_is_consume_once_and_names_the_outcome(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100)
    )
    await reserve(ledger, tenant, "k1", 500, "tenant:acme")
    await reserve(ledger, tenant, "k2", 200, "tenant:acme")
    won = await ledger.approve(tenant, "k1", "alice", ttl_ms=HOUR_MS)
    assert (won.state, won.by) == (HoldState.PENDING, "alice")
    with pytest.raises(HoldStateConflict) as lost:
        await ledger.approve(tenant, "k1", "bob", ttl_ms=HOUR_MS)
    assert (lost.value.state, lost.value.by) == (HoldState.PENDING, "alice")
    await ledger.reject(tenant, "k2", "bob")
    with pytest.raises(HoldStateConflict) as late:
        await ledger.approve(tenant, "k2", "alice", ttl_ms=HOUR_MS)
    assert (late.value.state, late.value.by) == (HoldState.REJECTED, "bob")
    assert await used(ledger, tenant, "tenant:acme") == (500, 0)


async def test_approval_returns_the_new_deadline_and_the_kept_request(
    ledger: Ledger, tenant: str
) -> None:
    """The approver forwards what was held, by Redis's deadline: no second read, no
    clock of its own."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100)
    )
    await reserve(ledger, tenant, "k1", 500, "tenant:acme", request='{"effect":1}')
    before = await server_ms(ledger)
    won = await ledger.approve(tenant, "k1", "alice", ttl_ms=HOUR_MS)
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None
    assert (won.status, won.request, won.deadline_ms) == (
        Status.OK,
        '{"effect":1}',
        hold.deadline_ms,
    )
    assert before + HOUR_MS <= won.deadline_ms <= await server_ms(ledger) + HOUR_MS


async def test_expiry_releases_only_what_provably_never_fired(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=400)
    )
    await reserve(ledger, tenant, "later", 100, "tenant:acme")
    await reserve(ledger, tenant, "armed", 100, "tenant:acme", ttl_ms=0)
    await reserve(ledger, tenant, "unarmed", 100, "tenant:acme", ttl_ms=0, armed=False)
    await reserve(ledger, tenant, "escalated", 300, "tenant:acme", escalation_ttl_ms=0)
    with pytest.raises(HoldNotDue):
        await ledger.expire(tenant, "later")
    # The escalating reserve expired the holds due before it; the sweeper finds the last.
    result = await ledger.sweep(tenant)
    assert (result.visited, result.remaining_due) == (1, 0)
    states = {
        k: (await stored_hold(ledger, tenant, k)).state for k in ("armed", "unarmed", "escalated")
    }
    assert states == {
        "armed": HoldState.AMBIGUOUS,
        "unarmed": HoldState.EXPIRED,
        "escalated": HoldState.EXPIRED,
    }
    assert await used(ledger, tenant, "tenant:acme") == (200, 0)
    late = await ledger.post(tenant, "unarmed", 100)
    assert late.flags == {"late"}
    assert await used(ledger, tenant, "tenant:acme") == (200, 100)


async def test_reserve_expires_due_holds_before_deciding(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "old", 900, "tenant:acme", ttl_ms=0, armed=False)
    fresh = await reserve(ledger, tenant, "new", 900, "tenant:acme")
    assert fresh.decision is Verdict.ADMIT
    assert fresh.accounts[0].used == 0


async def test_an_admission_leaves_due_holds_to_the_sweeper(ledger: Ledger, tenant: str) -> None:
    """A release only makes room, so a reserve admitted with holds due does not stop
    to expire them (one Redis call less on the common path): they stay charged, and
    counted in what it reports as used, until the sweeper or a refusal expires them."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await reserve(ledger, tenant, "old", 100, "tenant:acme", ttl_ms=0, armed=False)
    fresh = await reserve(ledger, tenant, "new", 100, "tenant:acme")
    assert (fresh.decision, fresh.accounts[0].used) == (Verdict.ADMIT, 100)
    assert (await stored_hold(ledger, tenant, "old")).state is HoldState.PENDING
    # One that only fits once "old" is released expires it first, then decides.
    third = await reserve(ledger, tenant, "third", 850, "tenant:acme")
    assert (third.decision, third.accounts[0].used) == (Verdict.ADMIT, 100)
    assert (await stored_hold(ledger, tenant, "old")).state is HoldState.EXPIRED
    assert await used(ledger, tenant, "tenant:acme") == (950, 0)


async def test_expired_escalation_cannot_be_approved(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=0)
    )
    await reserve(ledger, tenant, "k1", 100, "tenant:acme", escalation_ttl_ms=0)
    with pytest.raises(HoldStateConflict) as caught:
        await ledger.approve(tenant, "k1", "alice", ttl_ms=HOUR_MS)
    assert caught.value.state is HoldState.EXPIRED
    assert await used(ledger, tenant, "tenant:acme") == (0, 0)


async def test_unknown_hold(ledger: Ledger, tenant: str) -> None:
    with pytest.raises(HoldNotFound):
        await ledger.post(tenant, "nope", 1)
    assert await ledger.hold(tenant, "nope") is None


async def test_a_batch_beside_due_holds_decides_as_single_calls_would(
    ledger: Ledger, tenant: str
) -> None:
    """An item admitted at once beside a due hold would take the room that an earlier
    item, sent back to expire it first, is decided on after it: in a batch, every item
    looks for due holds before it decides, and all come back to be decided in order."""
    from ledger.records import ReserveRequest

    requests = [
        ReserveRequest(
            idempotency_key=key, fingerprint="fp", amounts={"tenant:acme": price}, ttl_ms=HOUR_MS
        )
        for key, price in (("a", 600), ("b", 500))
    ]
    decided = []
    for batched in (True, False):
        owner = f"{tenant}-{'batch' if batched else 'single'}"
        await open_accounts(ledger, owner, tenant_acme=1000)
        await reserve(ledger, owner, "old", 500, "tenant:acme", ttl_ms=0, armed=False)
        if batched:
            results = await ledger.reserve_many(owner, requests)
        else:
            results = [
                await ledger.reserve(owner, r.idempotency_key, "fp", r.amounts, ttl_ms=HOUR_MS)
                for r in requests
            ]
        decided.append([getattr(r, "decision", r) for r in results])
        assert (await stored_hold(ledger, owner, "old")).state is HoldState.EXPIRED
    assert decided == [[Verdict.ADMIT, Verdict.DENY]] * 2


async def test_windows_roll_posted_off_and_carry_pending(ledger: Ledger, tenant: str) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000, window_ms=1)
    )
    await reserve(ledger, tenant, "posted", 600, "tenant:acme")
    await reserve(ledger, tenant, "open", 300, "tenant:acme")
    await ledger.post(tenant, "posted", 600)
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None
    posted_at = balance.window_start_ms
    # One-millisecond windows: wait until the server's clock has moved on.
    while await server_ms(ledger) <= posted_at:
        pass
    fresh = await reserve(ledger, tenant, "next", 700, "tenant:acme")
    assert fresh.decision is Verdict.ADMIT
    assert fresh.accounts[0].used == 300
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None and balance.window_start_ms > posted_at
    # The compensation of a post from a past window returns nothing: it rolled off.
    result = await ledger.compensate(tenant, "posted", 100)
    assert result.flags == {"rolled_off"}
    assert balance.posted == 0


async def test_batches_decide_in_order_like_single_calls(ledger: Ledger, tenant: str) -> None:
    from ledger.records import ReserveRequest

    await open_accounts(ledger, tenant, tenant_acme=1000)
    requests = [
        ReserveRequest(
            idempotency_key=f"b{i}", fingerprint="fp", amounts={"tenant:acme": 300}, ttl_ms=HOUR_MS
        )
        for i in range(5)
    ]
    results = await ledger.reserve_many(tenant, requests)
    assert [getattr(r, "decision", r) for r in results] == ["admit"] * 3 + ["deny"] * 2
    posts = await ledger.post_many(tenant, [("b0", 100), ("b1", 400), ("b3", 1)])
    assert [getattr(p, "flags", p) for p in posts[:2]] == [frozenset(), {"overrun"}]
    assert isinstance(posts[2], HoldStateConflict) and posts[2].state is HoldState.DENIED
    assert await used(ledger, tenant, "tenant:acme") == (300, 500)
    # An empty batch is an empty answer (it raised IndexError, reading its first keys).
    assert await ledger.reserve_many(tenant, []) == []
    assert await ledger.post_many(tenant, []) == []


async def test_request_kept_while_live_and_outcome_once_settled(
    ledger: Ledger, tenant: str
) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=500)
    )
    await ledger.reserve(tenant, "small", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS, request="R1")
    await ledger.reserve(tenant, "big", "fp", {"tenant:acme": 600}, ttl_ms=HOUR_MS, request="R2")
    small, big = await ledger.hold(tenant, "small"), await ledger.hold(tenant, "big")
    assert small is not None and big is not None and big.state is HoldState.ESCALATED
    assert (small.request, big.request) == ("R1", "R2")
    await ledger.post(tenant, "small", 100, outcome='{"s": 201}')
    await ledger.void(tenant, "big", outcome='{"s": 409}')
    small, big = await ledger.hold(tenant, "small"), await ledger.hold(tenant, "big")
    assert small is not None and (small.request, small.outcome) == ("", '{"s": 201}')
    assert big is not None and (big.request, big.outcome) == ("", '{"s": 409}')


# A gateway's stored request is some hundreds of bytes (irrev/bench/ledger.py's).
GATEWAY_SIZED_REQUEST = '{"agent":"a1","tool":"shop","body_b64":"' + "x" * 300 + '"}'
GATEWAY_SIZED_ANSWER = '{"a":"a1","s":201}\n{"order":"' + "y" * 200 + '"}'
# Longer than the record keeps (INLINE_OUTCOME in lua/_lib.lua).
LONG_ANSWER = '{"a":"a1","s":201}\n' + "z" * 2000


async def test_the_request_and_the_outcome_live_beside_the_record(
    ledger: Ledger, tenant: str
) -> None:
    """A value over 64 bytes in the record would make Redis keep the whole hash as a
    table (about 3x the memory) until the record expires: the request is a key of its
    own (the payload); the outcome is kept in the record, in parts of under 64 bytes
    (one key per settled hold, not two), or, when long, as the payload. A settlement
    without an outcome drops the payload; one with keeps it for the record's
    retention."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000)
    )
    keys = ("posted", "voided", "posted-bare", "voided-bare", "posted-long", "voided-long")
    for key in keys:
        await reserve(ledger, tenant, key, 100, "tenant:acme", request=GATEWAY_SIZED_REQUEST)
        assert await ledger.redis.object("encoding", hold_key(tenant, key)) in COMPACT
        assert await ledger.redis.get(payload_key(tenant, key)) == GATEWAY_SIZED_REQUEST
    await ledger.post(tenant, "posted", 100, outcome=GATEWAY_SIZED_ANSWER)
    await ledger.void(tenant, "voided", outcome=GATEWAY_SIZED_ANSWER)
    await ledger.post(tenant, "posted-bare", 100)
    await ledger.void(tenant, "voided-bare")
    await ledger.post(tenant, "posted-long", 100, outcome=LONG_ANSWER)
    await ledger.void(tenant, "voided-long", outcome=LONG_ANSWER)
    for key in keys:
        assert await ledger.redis.object("encoding", hold_key(tenant, key)) in COMPACT
        found = await ledger.hold(tenant, key)
        assert found is not None and found.request == ""
        if key.endswith("-long"):
            assert found.outcome == LONG_ANSWER
            assert 0 < await ledger.redis.pttl(payload_key(tenant, key)) <= ledger.retention_ms
        else:
            assert found.outcome == ("" if key.endswith("-bare") else GATEWAY_SIZED_ANSWER)
            assert not await ledger.redis.exists(payload_key(tenant, key))
    # A compensation starts the retention of both again.
    await ledger.redis.pexpire(payload_key(tenant, "posted-long"), 60_000)
    await ledger.compensate(tenant, "posted-long", 10)
    assert await ledger.redis.pttl(payload_key(tenant, "posted-long")) > 60_000


async def test_an_outcome_kept_in_the_record_survives_cuts_between_characters(
    ledger: Ledger, tenant: str
) -> None:
    """Each part is read as UTF-8 text: a cut inside a character would fail the read."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10_000, soft_limit=10_000)
    )
    for shift in range(4):
        answer = "x" * shift + "caf\u00e9 \u2603 \U0001f600 " * 40
        assert len(answer.encode()) <= 1024
        key = f"utf8-{shift}"
        await reserve(ledger, tenant, key, 1, "tenant:acme")
        await ledger.post(tenant, key, 1, outcome=answer)
        found = await ledger.hold(tenant, key)
        assert found is not None and found.outcome == answer
        assert await ledger.redis.object("encoding", hold_key(tenant, key)) in COMPACT


async def test_an_outcome_an_older_irrev_kept_as_the_payload_is_still_read(
    ledger: Ledger, tenant: str
) -> None:
    """Before outcomes were kept in the record, a settled hold's was its payload."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000)
    )
    await reserve(ledger, tenant, "old", 100, "tenant:acme", request=GATEWAY_SIZED_REQUEST)
    await ledger.post(tenant, "old", 100)
    await ledger.redis.set(payload_key(tenant, "old"), GATEWAY_SIZED_ANSWER)
    found = await ledger.hold(tenant, "old")
    assert found is not None and (found.request, found.outcome) == ("", GATEWAY_SIZED_ANSWER)


# Redis 6.2 calls a packed hash a ziplist, 7 a listpack.
COMPACT = ("listpack", "ziplist")


async def test_a_rejected_or_expired_holds_request_lasts_as_its_record(
    ledger: Ledger, tenant: str
) -> None:
    """Both kept for the retention (whose the hold was stays known); an expired hold
    made ambiguous by a late answer keeps both for good, for the reconciler."""
    await ledger.upsert_account(
        tenant,
        AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000, approval_threshold=1),
    )
    await reserve(ledger, tenant, "rejected", 100, "tenant:acme", request="R1")
    await ledger.reject(tenant, "rejected", "bob")
    await reserve(ledger, tenant, "expired", 100, "tenant:acme", request="R2", escalation_ttl_ms=0)
    await ledger.sweep(tenant)
    for key in ("rejected", "expired"):
        found = await ledger.hold(tenant, key)
        assert found is not None and found.state.value == key and found.request
        assert await ledger.redis.pttl(payload_key(tenant, key)) > 0
        assert await ledger.redis.pttl(hold_key(tenant, key)) > 0


async def _read_until_settled(
    ledger: Ledger, tenant: str, key: str, reads: list[tuple[str, str, str]]
) -> None:
    while not reads or reads[-1][0] == "pending":
        found = await ledger.hold(tenant, key)
        assert found is not None
        reads.append((found.state.value, found.request, found.outcome))


async def _post_soon(ledger: Ledger, tenant: str, key: str) -> None:
    await asyncio.sleep(0)
    await ledger.post(tenant, key, 1, outcome="OUTCOME")


async def test_a_hold_read_during_its_settlement_never_takes_the_outcome_for_the_request(
    ledger: Ledger, tenant: str
) -> None:
    """The record and the payload are two keys: a read that met the record before a
    post and the payload after it must not hand the outcome out as the request of a
    live hold (a repeat would send the answer upstream as the effect)."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=10**9, soft_limit=10**9)
    )
    for round_ in range(30):
        key = f"race-{round_}"
        await reserve(ledger, tenant, key, 1, "tenant:acme", request="REQUEST")
        reads: list[tuple[str, str, str]] = []
        readers = [_read_until_settled(ledger, tenant, key, reads) for _ in range(3)]
        await asyncio.gather(*readers, _post_soon(ledger, tenant, key))
        for read in reads:
            assert read in (("pending", "REQUEST", ""), ("posted", "", "OUTCOME")), reads


async def test_a_new_hold_never_takes_a_payload_left_under_its_id(
    ledger: Ledger, tenant: str
) -> None:
    """A payload that outlived its record (one written by an older irrev, say) is not
    the request of a later hold under the same id: approving that hold must forward
    what it was reserved with (here nothing), never the stale bytes."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100)
    )
    for hold_id in ("escalated", "denied"):
        await ledger.redis.set(payload_key(tenant, hold_id), '{"stale":"effect"}')
    await reserve(ledger, tenant, "escalated", 500, "tenant:acme")
    await reserve(ledger, tenant, "denied", 5000, "tenant:acme", request='{"new":1}')
    won = await ledger.approve(tenant, "escalated", "alice", ttl_ms=HOUR_MS)
    assert won.request == ""
    for hold_id in ("escalated", "denied"):
        hold = await ledger.hold(tenant, hold_id)
        assert hold is not None and hold.request == "", hold_id


async def test_approving_a_hold_of_an_older_irrev_forwards_the_request_in_its_record(
    ledger: Ledger, tenant: str
) -> None:
    """A hold reserved by an older irrev (sharing the Redis during an upgrade) kept its
    request in its record's `req` field, not in a payload key: approving it hands that
    request to the approver; a payload, where there is one, comes first."""
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:acme", limit=1000, soft_limit=100)
    )
    await reserve(ledger, tenant, "old", 500, "tenant:acme", request='{"old":1}')
    await ledger.redis.hset(hold_key(tenant, "old"), "req", '{"old":1}')
    await ledger.redis.delete(payload_key(tenant, "old"))
    await reserve(ledger, tenant, "new", 500, "tenant:acme", request='{"new":1}')
    await ledger.redis.hset(hold_key(tenant, "new"), "req", '{"older":1}')
    assert (await ledger.approve(tenant, "old", "alice", ttl_ms=HOUR_MS)).request == '{"old":1}'
    assert (await ledger.approve(tenant, "new", "alice", ttl_ms=HOUR_MS)).request == '{"new":1}'
