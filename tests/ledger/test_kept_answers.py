"""An agent's allowance of kept answer bytes per UTC day (post.lua, void.lua,
kept_within in lua/_lib.lua): a settled hold keeps its answer for its retention, and
one agent's answers must not fill the Redis its tenant's admissions need. Past the
allowance the answer is kept short (the caller's form without the body), the hold
settles all the same, and racing settlements never keep more than the allowance."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ledger.client import Ledger
from ledger.errors import BadInput, LedgerUnavailable
from ledger.keys import hold_script_keys, kept_answers_key
from ledger.records import BODY_OMITTED_FLAG, AnswerAllowance, HoldState, Status

from .conftest import open_accounts
from .test_holds import reserve

DAY_MS = 86_400_000
SHORT = "short"


def whole(size: int) -> str:
    return "w" * size


async def kept(ledger: Ledger, tenant: str, hold_id: str) -> str:
    hold = await ledger.hold(tenant, hold_id)
    assert hold is not None
    return hold.outcome


async def used_today(ledger: Ledger, tenant: str, agent: str) -> int:
    return int(await ledger.redis.get(kept_answers_key(tenant, agent)) or 0)


async def test_answers_past_the_allowance_are_kept_short_and_the_holds_settle(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    allowance = AnswerAllowance("a1", 2500, SHORT)
    for key in ("k1", "k2", "k3", "k4", "other"):
        await reserve(ledger, tenant, key, 10, "tenant:acme")
    first = await ledger.post(tenant, "k1", 10, outcome=whole(1000), allowance=allowance)
    second = await ledger.post(tenant, "k2", 10, outcome=whole(1000), allowance=allowance)
    third = await ledger.post(tenant, "k3", 10, outcome=whole(1000), allowance=allowance)
    assert BODY_OMITTED_FLAG not in first.flags | second.flags
    assert third.status is Status.OK and third.state is HoldState.POSTED
    assert BODY_OMITTED_FLAG in third.flags
    assert [await kept(ledger, tenant, k) for k in ("k1", "k2", "k3")] == [
        whole(1000),
        whole(1000),
        SHORT,
    ]
    assert await used_today(ledger, tenant, "a1") == 2000
    # What still fits is kept: the allowance is used, not closed by one refusal.
    smaller = await ledger.void(tenant, "k4", outcome=whole(500), allowance=allowance)
    assert smaller.state is HoldState.VOIDED and BODY_OMITTED_FLAG not in smaller.flags
    assert await used_today(ledger, tenant, "a1") == 2500
    # Another agent's count is its own.
    other = AnswerAllowance("a2", 2500, SHORT)
    await ledger.post(tenant, "other", 10, outcome=whole(2000), allowance=other)
    assert await kept(ledger, tenant, "other") == whole(2000)
    # The count ends with the UTC day it counts.
    seconds, micros = await ledger.redis.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    left_ms = await ledger.redis.pttl(kept_answers_key(tenant, "a1"))  # 6.2: no PEXPIRETIME
    assert abs(now_ms + left_ms - (now_ms // DAY_MS + 1) * DAY_MS) < 1000


async def test_a_replayed_post_counts_nothing_and_a_small_answer_is_never_cut(
    ledger: Ledger, tenant: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    allowance = AnswerAllowance("a1", 0, "a short form longer than the answer")
    await reserve(ledger, tenant, "k1", 10, "tenant:acme")
    await ledger.post(tenant, "k1", 10, outcome="{}", allowance=allowance)
    again = await ledger.post(tenant, "k1", 10, outcome=whole(10), allowance=allowance)
    assert again.status is Status.EXISTS
    assert await kept(ledger, tenant, "k1") == "{}"
    assert await used_today(ledger, tenant, "a1") == 0


@pytest.mark.parametrize(
    ("allowance", "field"),
    [
        (AnswerAllowance("a1", -1, SHORT), "allowance"),
        (AnswerAllowance("a1", 1.5, SHORT), "allowance"),  # type: ignore[arg-type]
        (AnswerAllowance("a1", 10, ""), "short"),
        (AnswerAllowance("a 1", 10, SHORT), "agent"),
    ],
)
async def test_a_bad_allowance_is_refused_before_anything_is_written(
    ledger: Ledger, tenant: str, allowance: AnswerAllowance, field: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    await reserve(ledger, tenant, "k1", 10, "tenant:acme")
    with pytest.raises(BadInput) as caught:
        await ledger.post(tenant, "k1", 10, outcome=whole(10), allowance=allowance)
    assert caught.value.field == field
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None and hold.state is HoldState.PENDING


@pytest.mark.parametrize(
    ("args", "extra", "field"),
    [
        (["a1", SHORT, "10"], [], "agent"),  # no count key
        (["a1", SHORT, "10"], ["a2"], "agent"),  # another agent's count
        (["a1", "", "10"], ["a1"], "short"),
        (["a1", SHORT, "1e3"], ["a1"], "allowance"),
        (["", "", ""], ["a1"], "agent"),  # a count key nobody asked for
    ],
)
async def test_the_scripts_check_the_allowance_they_are_given(
    ledger: Ledger, tenant: str, args: list[str], extra: list[str], field: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    await reserve(ledger, tenant, "k1", 10, "tenant:acme")
    keys = [*hold_script_keys(tenant, "k1"), *(kept_answers_key(tenant, a) for a in extra)]
    for operation, tail in (("post", ["*", "10"]), ("void", [])):
        reply = await ledger._run(operation, keys, ["k1", "0", whole(10), *args, *tail])
        assert reply[:2] == ["bad_input", field], reply
    hold = await ledger.hold(tenant, "k1")
    assert hold is not None and hold.state is HoldState.PENDING


async def test_another_tenants_count_is_refused(ledger: Ledger, tenant: str) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    await reserve(ledger, tenant, "k1", 10, "tenant:acme")
    keys = [*hold_script_keys(tenant, "k1"), kept_answers_key(f"{tenant}-victim", "a1")]
    with pytest.raises(LedgerUnavailable, match=r"KEYS\[8\]|same slot"):
        await ledger._run("post", keys, ["k1", "0", whole(10), "a1", SHORT, "10", "*", "10"])


THREADS = 6
POSTS = 20  # per thread
SIZE = 1000
ALLOWANCE = 37_500  # 37 answers of 1000 fit: 120 race for them


def settle_in_thread(redis_url: str, tenant: str, thread: int, flags: list[bool]) -> None:
    """One OS thread with its own event loop and connections, posting its holds."""

    async def run() -> None:
        ledger = Ledger.from_url(redis_url)
        allowance = AnswerAllowance("racer", ALLOWANCE, SHORT)
        try:
            results = await asyncio.gather(
                *(
                    ledger.post(
                        tenant, f"h{thread}-{i}", 1, outcome=whole(SIZE), allowance=allowance
                    )
                    for i in range(POSTS)
                )
            )
        finally:
            await ledger.aclose()
        flags.extend(BODY_OMITTED_FLAG in r.flags for r in results)

    asyncio.run(run())


async def test_racing_settlements_of_one_agent_never_keep_more_than_its_allowance(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await open_accounts(ledger, tenant, tenant_acme=10_000)
    holds = [f"h{t}-{i}" for t in range(THREADS) for i in range(POSTS)]
    for hold_id in holds:
        await reserve(ledger, tenant, hold_id, 1, "tenant:acme")
    flags: list[bool] = []
    threads = [
        threading.Thread(target=settle_in_thread, args=(redis_url, tenant, t, flags))
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    outcomes = [await kept(ledger, tenant, hold_id) for hold_id in holds]
    whole_kept = sum(len(o) for o in outcomes if o != SHORT)
    print(f"{len(holds)} racing posts: {whole_kept} bytes kept whole, allowance {ALLOWANCE}")
    assert len(flags) == len(holds) and flags.count(False) == ALLOWANCE // SIZE
    assert whole_kept == await used_today(ledger, tenant, "racer") == 37_000
    assert sum(o == SHORT for o in outcomes) == len(holds) - ALLOWANCE // SIZE
