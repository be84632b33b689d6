"""Escrow (ledger/escrow.py, lua/escrow.lua, lua/escrow_shard.lua): one tenant's limits
split over shards in their own slots. Whatever the transfers between them do, and
wherever a process dies between a transfer's two steps, the tenant's admissions stay
within its limits, and unleased + slices + transfers in flight = each limit. Against
real Redis; the crash case with real processes and SIGKILL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import pytest

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.errors import BadInput, ShortOfRoom, TenantEscrowed, UnknownAccount
from ledger.escrow import Escrow, EscrowConflict, _write
from ledger.journal import read_journal
from ledger.keys import accounts_key, escrow_key, hold_key
from ledger.limits import MAX_AMOUNT
from ledger.records import AccountSpec

from .test_concurrency import ROOT, kill_mid_storm, release

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


async def escrowed(ledger: Ledger, tenant: str, shards: int = 3, **limits: int) -> Escrow:
    """`tenant` split over `shards`, with accounts named like `tenant_acme=1000`."""
    escrow = await Escrow.split(ledger, tenant, shards)
    for name, limit in limits.items():
        kind, _, rest = name.partition("_")
        await escrow.define(AccountSpec(account=f"{kind}:{rest}", limit=limit, soft_limit=limit))
    return escrow


async def test_concurrent_reserves_fill_the_limit_exactly_over_shards(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=1000, agent_a=600)
    amounts = {"tenant:acme": 10, "agent:a": 5}
    results = await asyncio.gather(
        *(escrow.reserve(f"k{i}", "fp", amounts, ttl_ms=HOUR_MS) for i in range(110))
    )
    decisions = Counter(result.decision for result in results)
    # One process: its refills of a slice go one at a time, so no shard loses another's
    # reclaim, and the limit fills to the unit. Every shard took some of them.
    assert decisions == {"admit": 100, "deny": 10}
    assert await escrow.used("tenant:acme") == 1000
    assert {escrow.shard_for(f"k{i}") for i in range(110)} == {0, 1, 2}
    report = await escrow.audit()
    assert report.ok, report.mismatches
    assert report.in_flight == 0
    replay = await escrow.reserve("k1", "fp", amounts, ttl_ms=HOUR_MS)
    assert replay.replayed and replay.decision == results[1].decision


async def test_a_hold_settles_on_its_shard_and_frees_room_for_every_shard(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=100)
    first = await escrow.reserve("a", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
    assert first.decision == "admit"
    others = [f"b{i}" for i in range(100) if escrow.shard_for(f"b{i}") != escrow.shard_for("a")]
    other, again = others[:2]
    assert (
        await escrow.reserve(other, "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    ).decision == "deny"
    await escrow.post("a", 60)
    # The 40 released on a's shard are reclaimed by another shard's refill.
    result = await escrow.reserve(again, "fp", {"tenant:acme": 40}, ttl_ms=HOUR_MS)
    assert result.decision == "admit"
    assert await escrow.used("tenant:acme") == 100
    assert (await escrow.audit()).ok


async def test_the_soft_band_holds_over_the_tenant_not_per_slice(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await Escrow.split(ledger, tenant, 3)
    await escrow.define(AccountSpec(account="tenant:acme", limit=1000, soft_limit=500))
    results = await asyncio.gather(
        *(escrow.reserve(f"k{i}", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS) for i in range(40))
    )
    # 400 is below the band: slices grow until their shares of it hold each hold.
    assert {result.decision for result in results} == {"admit"}
    above = await escrow.reserve("big", "fp", {"tenant:acme": 200}, ttl_ms=HOUR_MS)
    assert (above.decision, above.reason) == ("escalate", "soft_band")
    assert (await escrow.audit()).ok


async def test_a_shard_reserve_short_of_room_writes_nothing(ledger: Ledger, tenant: str) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=100)
    shard = escrow.shards[0]
    await escrow.refill(0, "tenant:acme", 10)
    journal = len(await read_journal(ledger, shard))
    with pytest.raises(ShortOfRoom) as short:
        await ledger.reserve(shard, "h", "fp", {"tenant:acme": 90}, ttl_ms=HOUR_MS, escrowed=True)
    slice_ = await ledger.balance(shard, "tenant:acme")
    assert slice_ is not None
    assert short.value.reason == "budget_exceeded"
    assert short.value.lacks == {"tenant:acme": 90 - slice_.limit}
    assert not await ledger.redis.exists(hold_key(shard, "h"))
    assert len(await read_journal(ledger, shard)) == journal
    # Without the escrow flag the same shard decides as any tenant: a denial, written.
    plain = await ledger.reserve(shard, "h", "fp", {"tenant:acme": 90}, ttl_ms=HOUR_MS)
    assert plain.decision == "deny"


async def test_concurrent_reclaims_give_back_at_most_the_unused_room(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    assert await escrow.refill(0, "tenant:acme", 900) == 900
    shard = escrow.shards[0]
    held = await ledger.reserve(shard, "h", "fp", {"tenant:acme": 300}, ttl_ms=HOUR_MS)
    assert held.decision == "admit"
    taken = await asyncio.gather(*(escrow.reclaim(0, "tenant:acme", 200) for _ in range(8)))
    assert sum(taken) == 600  # the slice's 900 less the 300 it holds
    slice_ = await ledger.balance(shard, "tenant:acme")
    assert slice_ is not None and slice_.limit == 300 and slice_.used == 300
    assert await escrow.unleased("tenant:acme") == 700
    assert (await escrow.audit()).ok


async def test_each_transfer_step_counts_once(ledger: Ledger, tenant: str) -> None:
    """A step sent again (a retry after a timeout, recover() beside the transfer)
    changes nothing the second time."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    grant = ["grant", "g-1", "0", "tenant:acme", "100", "100"]
    first = await _write(ledger, "escrow", tenant, grant)
    again = await _write(ledger, "escrow", tenant, grant)
    assert first[0] == "ok" and again[0] == "exists" and again[1:3] == first[1:3]
    apply = ["apply", "g-1", "tenant:acme", "100", first[2], "1000", "1000", "0", "0"]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], apply))[0] == "ok"
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], apply))[0] == "exists"
    yield_ = ["yield", "y-1", "tenant:acme", "40", "0", "1000", "1000"]
    taken = await _write(ledger, "escrow_shard", escrow.shards[0], yield_)
    assert taken[:2] == ["ok", "40"]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], yield_))[:2] == ["exists", "40"]
    receive = ["receive", "y-1", "0", "tenant:acme", "40", taken[2]]
    assert (await _write(ledger, "escrow", tenant, receive))[0] == "ok"
    assert (await _write(ledger, "escrow", tenant, receive))[0] == "exists"
    report = await escrow.audit()
    assert report.ok, report.mismatches
    # Each landed on its receiving side; only its forgetting (granted, yielded) is left.
    assert report.in_flight == 0
    recovered = await escrow.recover()
    assert (recovered.grants, recovered.reclaims, recovered.stranded) == (1, 1, [])
    assert await escrow.unleased("tenant:acme") == 940
    assert (await escrow.audit()).ok


async def test_a_transfer_past_its_retention_is_stranded_never_counted_twice(
    ledger: Ledger, tenant: str
) -> None:
    """A grant taken 8 days ago by a process that died before applying it, and a
    reclaim yielded as long ago and never received: each side may have forgotten their
    ids by now (it keeps them 7 days), so neither is counted; their budget stays
    stranded, held nowhere."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    long_ago = await ledger.now_ms() - 8 * DAY_MS
    await ledger.redis.hset(escrow_key(tenant), "g|g-old", f"1|tenant:acme|50|{long_ago}")
    await ledger.redis.hincrby(escrow_key(tenant), "u|tenant:acme", -50)
    assert await escrow.refill(2, "tenant:acme", 30) > 0
    await ledger.redis.hset(escrow_key(escrow.shards[2]), "y|y-old", f"tenant:acme|30|{long_ago}")
    await ledger.redis.hincrby(accounts_key(escrow.shards[2]), "tenant:acme|limit", -30)
    late = ["apply", "g-old", "tenant:acme", "50", str(long_ago), "1000", "1000", "0", "0"]
    assert await _write(ledger, "escrow_shard", escrow.shards[1], late) == ["stale"]
    recovered = await escrow.recover()
    assert (recovered.grants, recovered.reclaims, len(recovered.stranded)) == (0, 0, 2)
    assert await ledger.balance(escrow.shards[1], "tenant:acme") is None
    assert (await escrow.audit()).in_flight == 2
    assert await escrow.refill(1, "tenant:acme", 921) == 0  # only 920 is anywhere


async def test_a_transfer_id_is_remembered_whatever_another_caller_sends(
    ledger: Ledger, tenant: str
) -> None:
    """A hostile or misconfigured caller cannot make a side forget the ids it has
    received (the retention is the scripts' own): a grant applied once is not applied
    again after other transfers, nor after a step sent with a retention argument."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    granted = await _write(
        ledger, "escrow", tenant, ["grant", "g-1", "0", "tenant:acme", "100", "1"]
    )
    apply = ["apply", "g-1", "tenant:acme", "100", granted[2], "1000", "1000", "0", "0"]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], apply))[0] == "ok"
    with_retention = ["apply", "g-2", *apply[2:], granted[7], "1"]
    refused = await _write(ledger, "escrow_shard", escrow.shards[0], with_retention)
    assert refused[:2] == ["bad_input", "arguments"]
    await escrow.refill(0, "tenant:acme", 200)
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], apply))[0] == "exists"


async def test_a_split_is_made_once(ledger: Ledger, tenant: str) -> None:
    escrow = await Escrow.split(ledger, tenant, 3)
    assert (await Escrow.of(ledger, tenant)).shards == escrow.shards
    with pytest.raises(EscrowConflict, match="split already"):
        await Escrow.split(ledger, tenant, 2)
    with pytest.raises(EscrowConflict, match="not split"):
        await Escrow.of(ledger, f"{tenant}-other")
    if ledger.topology.clustered:
        primaries = await ledger.topology.primaries()
        placed = {ledger.topology.primary_of(accounts_key(shard)) for shard in escrow.shards}
        assert len(placed) == min(3, len(primaries))


async def test_bad_input_is_refused_with_nothing_written(ledger: Ledger, tenant: str) -> None:
    with pytest.raises(BadInput, match="shards"):
        await Escrow.split(ledger, tenant, 0)
    escrow = await escrowed(ledger, tenant, tenant_acme=100)
    with pytest.raises(BadInput, match="soft_limit"):
        await escrow.define(AccountSpec(account="agent:a", limit=10, soft_limit=20))
    with pytest.raises(UnknownAccount):
        await escrow.reserve("h", "fp", {"agent:nobody": 1}, ttl_ms=HOUR_MS)
    bad = await _write(ledger, "escrow", tenant, ["grant", "g-9", "7", "tenant:acme", "5", "1"])
    assert bad[:2] == ["bad_input", "shard"]
    unknown = await _write(ledger, "escrow", tenant, ["grant", "g-9", "0", "agent:x", "5", "1"])
    assert unknown[0] == "unknown_account"
    assert not await ledger.redis.hexists(escrow_key(tenant), "g|g-9")
    assert await escrow.unleased("tenant:acme") == 100


async def test_sigkill_mid_transfers_never_overspends(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """Three processes reserve and post on one escrowed tenant with slices small
    enough that shards refill and reclaim throughout, and are SIGKILLed mid-storm:
    transfers are left between their steps. recover() finishes them, the audit is
    clean, and no account of the tenant holds more than its limit."""
    await escrowed(ledger, tenant, tenant_acme=1500, agent_shared=800)
    name = f"{tenant}:barrier"
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "irrev.faults.escrow_worker",
                redis_url,
                tenant,
                name,
                f"w{p}",
                "400",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(3)
    ]
    await release(ledger, name, len(workers))
    kill_mid_storm(workers, done=40)
    escrow = await Escrow.of(ledger, tenant)
    await escrow.recover()
    report = await escrow.audit()
    assert report.ok, report.mismatches
    assert report.in_flight == 0
    assert 0 < await escrow.used("tenant:acme") <= 1500
    assert await escrow.used("agent:shared") <= 800


async def test_the_audit_finds_a_slice_raised_outside_a_transfer(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=100)
    await escrow.refill(2, "tenant:acme", 10)
    assert (await escrow.audit()).ok
    await ledger.redis.hincrby(accounts_key(escrow.shards[2]), "tenant:acme|limit", 5)
    report = await escrow.audit()
    assert any("tenant:acme" in mismatch and "105" in mismatch for mismatch in report.mismatches)
    # `irrev ledger audit` finds it too: the parent is a tenant it audits.
    assert {tenant, *escrow.shards} <= set(await ledger.tenants())
    parent = await audit_tenant(ledger, tenant)
    assert any("105" in mismatch for mismatch in parent.mismatches)


async def test_a_hold_of_eight_accounts_opens_them_all_on_a_fresh_shard(
    ledger: Ledger, tenant: str
) -> None:
    names = {f"factor:f{i}": 100 for i in range(7)} | {"tenant:acme": 1000}
    escrow = await Escrow.split(ledger, tenant, 2)
    for account, limit in names.items():
        await escrow.define(AccountSpec(account=account, limit=limit, soft_limit=limit))
    result = await escrow.reserve("h", "fp", dict.fromkeys(names, 10), ttl_ms=HOUR_MS)
    assert result.decision == "admit"
    assert (await escrow.audit()).ok


async def test_a_fresh_shards_first_burst_opens_each_account_once(
    ledger: Ledger, tenant: str
) -> None:
    """100 reserves at once on three shards that have no account yet: each shard opens
    the account with one chunk (a twelfth of the limit), not one per reserve."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1_200_000)
    results = await asyncio.gather(
        *(escrow.reserve(f"k{i}", "fp", {"tenant:acme": 10}, ttl_ms=HOUR_MS) for i in range(100))
    )
    assert {result.decision for result in results} == {"admit"}
    assert await escrow.unleased("tenant:acme") == 1_200_000 - 3 * 100_000


async def test_huge_limits_with_a_small_band_escalate_and_never_hang_redis(
    ledger: Ledger, tenant: str
) -> None:
    """A limit of 2^53-1 with a band of 1000: the slice that covers a shard's holds
    is past what doubles count exactly. A reclaim from the shard keeps all of it
    (it looped for ever, hanging Redis), and a hold past the band escalates (the
    lease it asked for was refused as bad input)."""
    escrow = await Escrow.split(ledger, tenant, 2)
    await escrow.define(AccountSpec(account="tenant:acme", limit=MAX_AMOUNT, soft_limit=1000))
    first = await escrow.reserve("a", "fp", {"tenant:acme": 500}, ttl_ms=HOUR_MS)
    assert first.decision == "admit"
    above = await escrow.reserve("b", "fp", {"tenant:acme": 20_000}, ttl_ms=HOUR_MS)
    assert (above.decision, above.reason) == ("escalate", "soft_band")
    k = escrow.shard_for("b")
    taken = await asyncio.wait_for(escrow.reclaim(k, "tenant:acme", 10**15), 60)
    assert taken == 0
    assert (await escrow.audit()).ok


async def test_define_moves_what_the_shards_hold_at_once(ledger: Ledger, tenant: str) -> None:
    """A lowered limit reclaims the shards' unused slices at once, and every slice's
    soft limit follows a new band, whatever another process has cached."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    other = await Escrow.of(ledger, tenant)
    assert await other.refill(0, "tenant:acme", 500) > 0
    held = await ledger.reserve(escrow.shards[0], "h", "fp", {"tenant:acme": 100}, ttl_ms=HOUR_MS)
    assert held.decision == "admit"
    await escrow.define(AccountSpec(account="tenant:acme", limit=1000, soft_limit=500))
    slice_ = await ledger.balance(escrow.shards[0], "tenant:acme")
    assert slice_ is not None and slice_.soft_limit == slice_.limit // 2
    await other.reclaim(0, "tenant:acme", 1)  # its cache says a band of 1000
    slice_ = await ledger.balance(escrow.shards[0], "tenant:acme")
    assert slice_ is not None and slice_.soft_limit == slice_.limit // 2
    defined = await escrow.define(AccountSpec(account="tenant:acme", limit=0, soft_limit=0))
    assert defined.unleased == -100 and not defined.kept
    assert (
        await escrow.reserve("more", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    ).decision == "deny"
    assert await escrow.used("tenant:acme") == 100
    assert (await escrow.audit()).ok


async def test_a_transfer_that_began_before_a_define_never_undoes_it(
    ledger: Ledger, tenant: str
) -> None:
    """A grant carries the account's definition as the parent had it; a define in
    another process may land before the grant is applied on its shard (or recover()
    applies it later). Then the apply, and a reclaim sized by that older definition,
    must not put the older band and threshold back on the slice: a stale copy never
    undoes a newer change. The steps are sent as escrow.py sends them, in that order."""
    escrow = await escrowed(ledger, tenant, tenant_acme=1000)
    assert await escrow.refill(0, "tenant:acme", 100) > 0
    granted = await _write(
        ledger, "escrow", tenant, ["grant", "g-1", "0", "tenant:acme", "100", "1"]
    )
    assert granted[0] == "ok"
    newer = AccountSpec(
        account="tenant:acme", limit=1000, soft_limit=500, window_ms=HOUR_MS, approval_threshold=7
    )
    await (await Escrow.of(ledger, tenant)).define(newer)

    async def slice_is_newer() -> None:
        slice_ = await ledger.balance(escrow.shards[0], "tenant:acme")
        assert slice_ is not None
        assert slice_.soft_limit == slice_.limit // 2, slice_
        assert (slice_.window_ms, slice_.approval_threshold) == (HOUR_MS, 7), slice_

    await slice_is_newer()
    amount, t0, defined = granted[1], granted[2], granted[3:]
    apply = ["apply", "g-1", "tenant:acme", amount, t0, *defined]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], apply))[0] == "ok"
    await slice_is_newer()
    # A reclaim by a process that read the definition with that grant: its limits,
    # and what the grant said of their age.
    yield_ = ["yield", "y-1", "tenant:acme", "10", "0", *defined[:2], *defined[4:]]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], yield_))[:2] == ["ok", "10"]
    await slice_is_newer()
    # The define before, whose reshape of this shard comes last (two operators, two
    # hosts); and a shard that had no slice yet, opened after it by the process that
    # still has the older definition.
    reshape = ["reshape", "r", "tenant:acme", *defined]
    assert (await _write(ledger, "escrow_shard", escrow.shards[0], reshape))[0] == "ok"
    await slice_is_newer()
    assert await escrow.refill(1, "tenant:acme", 50) > 0
    slice_ = await ledger.balance(escrow.shards[1], "tenant:acme")
    assert slice_ is not None and slice_.soft_limit == slice_.limit // 2, slice_
    assert (slice_.window_ms, slice_.approval_threshold) == (HOUR_MS, 7), slice_
    await escrow.recover()
    assert (await escrow.audit()).ok


async def test_limits_near_two_to_the_53_move_exactly(ledger: Ledger, tenant: str) -> None:
    escrow = await escrowed(ledger, tenant, tenant_acme=MAX_AMOUNT)
    spec = AccountSpec(account="tenant:acme", limit=MAX_AMOUNT - 1, soft_limit=MAX_AMOUNT - 1)
    assert (await escrow.define(spec)).unleased == MAX_AMOUNT - 1
    assert (await escrow.audit()).ok


async def test_an_escrowed_reserve_opens_no_account_and_a_shards_are_never_closed(
    ledger: Ledger, tenant: str
) -> None:
    """Opening a missing account with limits of its own, or closing an idle one, on a
    shard would make or drop budget outside any transfer: neither is possible."""
    escrow = await Escrow.split(ledger, tenant, 2)
    spec = AccountSpec(account="factor:payee", limit=100, soft_limit=100, window_ms=200)
    await escrow.define(spec)
    with pytest.raises(TypeError):
        await escrow.reserve("h", "fp", {"factor:payee": 10}, ttl_ms=HOUR_MS, open_missing=[spec])  # type: ignore[call-arg]
    assert (
        await escrow.reserve("h", "fp", {"factor:payee": 10}, ttl_ms=HOUR_MS)
    ).decision == "admit"
    await escrow.void("h")
    shard = escrow.shards[escrow.shard_for("h")]
    # Idle past the window it was used in: a plain tenant's would be closed now.
    voided_at = await ledger.now_ms()
    while await ledger.now_ms() < voided_at + 450:
        await asyncio.sleep(0.05)
    assert await ledger.close_idle_accounts(shard) == (0, 0)
    assert await ledger.balance(shard, "factor:payee") is not None
    assert (await escrow.audit()).ok


async def test_a_tenant_is_plain_or_split_never_both(ledger: Ledger, tenant: str) -> None:
    """An account a plain script defined or opened on a split tenant, or on one of its
    shards, would hold budget next to the escrow's slices, which no transfer moved and
    the escrow's audit does not count: twice the limit between them. So a split
    tenant and its shards refuse a plain define and a reserve's opening of an
    account, and a tenant with accounts of its own is not split (each failed before)."""
    spec = AccountSpec(account="tenant:acme", limit=100, soft_limit=100)
    plain = f"{tenant}-plain"
    await ledger.upsert_account(plain, spec)
    with pytest.raises(EscrowConflict, match="accounts of its own"):
        await Escrow.split(ledger, plain, 3)
    assert not await ledger.redis.exists(escrow_key(plain))
    escrow = await escrowed(ledger, tenant, tenant_acme=100)
    for where in (tenant, escrow.shards[1]):
        with pytest.raises(TenantEscrowed, match="escrow shards"):
            await ledger.upsert_account(where, spec)
        with pytest.raises(TenantEscrowed, match="escrow shards"):
            await ledger.reserve(
                where, "k-open", "fp", {"tenant:acme": 5}, ttl_ms=HOUR_MS, open_missing=[spec]
            )
        assert not await ledger.redis.exists(accounts_key(where), hold_key(where, "k-open"))
    assert (await escrow.audit()).ok
    assert await escrow.unleased("tenant:acme") == 100
