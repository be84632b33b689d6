"""Escrow defines carry the version of the policy their limits come from (ledger/escrow.py
`define`, lua/escrow.lua): two hosts holding two versions of a split tenant's policy,
defining in the wrong order, never put the older limits back, on the parent or on any
shard. Against real Redis; the hosts are two Escrow objects that share nothing but it."""

from __future__ import annotations

import asyncio
import random

import pytest

from ledger.client import Ledger
from ledger.errors import BadInput
from ledger.escrow import Escrow, _write
from ledger.escrow_audit import Definition
from ledger.keys import escrow_key
from ledger.records import AccountSpec

HOUR_MS = 3_600_000
ACCOUNT = "tenant:acme"


def version(v: int) -> AccountSpec:
    """Policy version v's limits for the account: every version's differ."""
    return AccountSpec(account=ACCOUNT, limit=1000 * v, soft_limit=500 * v, approval_threshold=v)


async def shapes(ledger: Ledger, escrow: Escrow) -> list[tuple[int, int, int]]:
    """Per shard holding a slice: (limit, soft limit, approval threshold) of its slice."""
    found = []
    for shard in escrow.shards:
        slice_ = await ledger.balance(shard, ACCOUNT)
        if slice_ is not None:
            found.append((slice_.limit, slice_.soft_limit, slice_.approval_threshold))
    return found


async def defined(escrow: Escrow) -> Definition:
    [account] = await escrow.accounts()
    return account.definition


async def test_an_older_policy_version_never_undoes_a_newer_one(
    ledger: Ledger, tenant: str
) -> None:
    first = await Escrow.split(ledger, tenant, 3)
    second = await Escrow.of(ledger, tenant)
    assert not (await first.define(version(1), policy_version=1)).kept
    assert await first.refill(0, ACCOUNT, 300) > 0
    assert not (await first.define(version(2), policy_version=2)).kept
    unleased = await first.unleased(ACCOUNT)
    # The second host still holds version 1 and writes it after the first wrote 2.
    stale = await second.define(version(1), policy_version=1)
    assert stale.kept and stale.unleased == unleased
    now = await defined(first)
    assert (now.limit, now.soft_limit, now.approval_threshold) == (2000, 1000, 2)
    assert await first.unleased(ACCOUNT) == unleased
    [(limit, soft, threshold)] = await shapes(ledger, first)
    assert (soft, threshold) == (limit // 2, 2)
    # What version 2 allows is admitted; version 1's limit would have denied it.
    amounts = {ACCOUNT: 1500}
    assert (await first.reserve("big", "fp", amounts, ttl_ms=HOUR_MS)).decision != "deny"
    # The same version again, and a newer one, are written as any define.
    assert not (await second.define(version(2), policy_version=2)).kept
    assert not (await second.define(version(3), policy_version=3)).kept
    assert (await defined(first)).limit == 3000
    assert (await first.audit()).ok


async def test_a_kept_define_finishes_the_reshapes_of_a_define_that_died(
    ledger: Ledger, tenant: str
) -> None:
    """A define is two steps: the parent, then each shard's reshape. A host that died
    between them left the shards shaped by the older definition; the next define of
    the account, even one the parent keeps out, shapes them by what the parent holds."""
    escrow = await Escrow.split(ledger, tenant, 3)
    await escrow.define(version(1), policy_version=1)
    for k in range(3):
        assert await escrow.refill(k, ACCOUNT, 100) > 0
    args = ["define", ACCOUNT, "2000", "1000", "0", "2", "2"]
    assert (await _write(ledger, "escrow", tenant, args))[0] == "ok"
    assert {shape[2] for shape in await shapes(ledger, escrow)} == {1}
    assert (await (await Escrow.of(ledger, tenant)).define(version(1), policy_version=1)).kept
    slices = await shapes(ledger, escrow)
    assert len(slices) == 3
    assert all((soft, threshold) == (limit // 2, 2) for limit, soft, threshold in slices)
    generation = (await defined(escrow)).generation
    for shard in escrow.shards:
        shaped = await ledger.redis.hget(escrow_key(shard), f"d|{ACCOUNT}")
        assert shaped is not None and int(str(shaped).split(",")[0]) == generation


async def test_hosts_defining_every_version_at_once_end_at_the_newest(
    ledger: Ledger, tenant: str
) -> None:
    """Two hosts send twelve versions in a shuffled order, all at once, while reserves
    refill the shards: the parent and every slice end at version 12's limits, and the
    amounts still add up."""
    first = await Escrow.split(ledger, tenant, 3)
    second = await Escrow.of(ledger, tenant)
    order = list(range(1, 13))
    random.Random(27).shuffle(order)
    hosts = [first, second]
    defines = [hosts[i % 2].define(version(v), policy_version=v) for i, v in enumerate(order)]
    await first.define(version(1), policy_version=1)
    reserves = [
        hosts[i % 2].reserve(f"r{i}", "fp", {ACCOUNT: 40}, ttl_ms=HOUR_MS) for i in range(60)
    ]
    done, _ = await asyncio.gather(asyncio.gather(*defines), asyncio.gather(*reserves))
    assert any(result.kept for result in done)
    now = await defined(first)
    assert (now.limit, now.soft_limit, now.approval_threshold) == (12000, 6000, 12)
    slices = await shapes(ledger, first)
    assert slices and all(
        (soft, threshold) == (limit // 2, 12) for limit, soft, threshold in slices
    )
    await first.recover()
    assert (await first.audit()).ok


async def test_a_policy_version_that_is_no_whole_number_is_refused(
    ledger: Ledger, tenant: str
) -> None:
    escrow = await Escrow.split(ledger, tenant, 2)
    await escrow.define(version(1), policy_version=5)
    with pytest.raises(BadInput, match="policy_version"):
        await escrow.define(version(2), policy_version=-1)
    refused = await _write(
        ledger, "escrow", tenant, ["define", ACCOUNT, "2000", "1000", "0", "2", "v6"]
    )
    assert refused[:2] == ["bad_input", "policy_version"]
    assert (await defined(escrow)).limit == 1000
