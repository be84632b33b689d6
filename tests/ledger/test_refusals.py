"""Refusal counts (ledger/refusals.py): what several processes add to one minute of a
tenant sums exactly, each minute's hash stays bounded and expires, and a server that
forgot the script is given it again; on every server, the cluster included."""

from __future__ import annotations

import pytest

from ledger import BadInput, Ledger, RefusalCount, RefusalCounts
from ledger.cluster import redis_client
from ledger.keys import refusals_key
from ledger.refusals import KEEP_MS


def count(reason: str, agent: str, route: str, n: int, transport: str = "http") -> RefusalCount:
    return RefusalCount(reason, transport, agent, route, n)


def totals(counts: list[RefusalCount]) -> dict[tuple[str, str, str, str], int]:
    return {(c.reason, c.transport, c.agent, c.route): c.count for c in counts}


async def test_what_processes_add_to_a_minute_sums_exactly(
    ledger: Ledger, redis_url: str, tenant: str
) -> None:
    other = Ledger.from_url(redis_url)  # another process's connection, as it were
    minute = (await ledger.now_ms()) // 60_000
    try:
        route = "supplier POST /orders"
        now = await ledger.refusals.add(
            minute,
            {
                tenant: [
                    count("budget_exceeded", "b1", route, 3),
                    count("per_effect_cap", "b2", route, 1),
                ]
            },
        )
        assert abs(now - await ledger.now_ms()) < 60_000  # Redis's clock, read by the call
        await other.refusals.add(
            minute,
            {
                tenant: [
                    count("budget_exceeded", "b1", route, 2),
                    count("unknown_route", "b1", "(unknown tool)", 1, "mcp"),
                ]
            },
        )
        read = await ledger.refusals.read(tenant, [minute - 1, minute])
    finally:
        await other.aclose()
    assert read[minute - 1] == []
    assert totals(read[minute]) == {
        ("budget_exceeded", "http", "b1", route): 5,
        ("per_effect_cap", "http", "b2", route): 1,
        ("unknown_route", "mcp", "b1", "(unknown tool)"): 1,
    }


async def test_a_minute_stays_bounded_and_expires(
    ledger: Ledger, redis_url: str, tenant: str
) -> None:
    small = RefusalCounts(ledger.redis, max_fields=3)
    minute = 29_000_000
    batch = [count("bad_json", f"agent-{i}", "supplier POST /orders", 1) for i in range(10)]
    await small.add(minute, {tenant: batch})
    await small.add(minute, {tenant: [count("bad_json", "agent-0", "supplier POST /orders", 4)]})
    [read] = (await small.read(tenant, [minute])).values()
    # The first three kept their own fields, the other seven went to the fallback.
    assert totals(read) == {
        **{("bad_json", "http", f"agent-{i}", "supplier POST /orders"): 1 for i in (1, 2)},
        ("bad_json", "http", "agent-0", "supplier POST /orders"): 5,
        ("bad_json", "http", "*", "*"): 7,
    }
    client = redis_client(redis_url, decode_responses=True)
    try:
        ttl = await client.pttl(refusals_key(tenant, minute))
    finally:
        await client.aclose()
    assert 0 < ttl <= KEEP_MS


async def test_a_server_that_forgot_the_script_is_given_it_again(
    ledger: Ledger, redis_url: str, tenant: str
) -> None:
    minute = 29_000_001
    await ledger.refusals.add(minute, {tenant: [count("bad_form", "b1", "-", 1)]})
    client = redis_client(redis_url)
    try:
        await client.script_flush()  # as a restarted Redis 6.2 would have
    finally:
        await client.aclose()
    await ledger.refusals.add(minute, {tenant: [count("bad_form", "b1", "-", 1)]})
    [read] = (await ledger.refusals.read(tenant, [minute])).values()
    assert totals(read) == {("bad_form", "http", "b1", "-"): 2}


async def test_refused_counts_are_refused_before_anything_is_written(
    ledger: Ledger, tenant: str
) -> None:
    for bad in (count("a|b", "b1", "r", 1), count("x", "", "r", 1), count("x", "b1", "r", 0)):
        with pytest.raises(BadInput):
            await ledger.refusals.add(29_000_002, {tenant: [bad]})
    assert (await ledger.refusals.read(tenant, [29_000_002]))[29_000_002] == []
