"""Refusals, seen (issue 26): every refusal the gateway gives an agent of a tenant, on
HTTP and MCP, before the ledger and by it, is counted by reason, agent and route in
Redis by every worker and host alike, and `GET /v1/admin/tenants/{t}/refusals` says so
the same from any of them; a worker counts in memory and writes once a flush.

Real gateways (the session's two workers and a peer host), real Redis."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from gateway.state.refusals import Flusher, RefusalTally
from irrev.harness import free_port
from ledger import Ledger

from .conftest import Gateway, TenantMaker
from .helpers import assert_mcp_refusal, assert_problem, effect_headers, mcp_call, order
from .procurement import example_accounts
from .servers import Tenant


@pytest.fixture(scope="module")
def refusals_tenant(new_tenant: TenantMaker) -> Tenant:
    """procurement, where facilities' agents are refused by the budget (its limit is
    1 USD) and platform's deployer may call only its deploy tool (issue 26)."""
    accounts = example_accounts()
    accounts["principals"]["facilities"] = {"limit": "1"}
    accounts["principals"]["platform"] = {"limit": "10000", "routes": ["deploy *"]}
    return new_tenant("refusals", accounts=accounts)


ORDERS = "supplier POST /orders"


async def refuse_all_kinds(http: httpx.AsyncClient, tenant: Tenant, n: int) -> Counter[tuple]:
    """`n` refusals of each kind through `http`; returns what was refused, as
    (reason, transport, agent, route) -> count."""
    seen: Counter[tuple] = Counter()
    for i in range(n):
        key = f"refuse-{i}-{time.monotonic_ns()}"
        # Before the ledger: the agent's per-effect cap (60,000 USD over 50,000).
        capped = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=600),
            headers=effect_headers(tenant, "buyer-01", key),
        )
        assert_problem(capped, 403, "per_effect_cap")
        seen["per_effect_cap", "http", "buyer-01", ORDERS] += 1
        # By the ledger: facilities' budget is 1 USD.
        broke = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=1),
            headers=effect_headers(tenant, "buyer-41", key),
        )
        assert_problem(broke, 403, "budget_exceeded")
        seen["budget_exceeded", "http", "buyer-41", ORDERS] += 1
        # Outside the principal's allow-list.
        scoped = await http.post(
            "/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "deployer-01", key),
        )
        assert_problem(scoped, 403, "route_not_allowed")
        seen["route_not_allowed", "http", "deployer-01", ORDERS] += 1
        # A path the catalog does not list: named by tool and method, not by the path.
        unlisted = await http.post(
            f"/tools/supplier/nowhere/{i}",
            json=order(),
            headers=effect_headers(tenant, "buyer-02", key),
        )
        assert_problem(unlisted, 403, "unknown_route")
        seen["unknown_route", "http", "buyer-02", "supplier POST (unlisted)"] += 1
        # A bad request.
        bad = await http.post(
            "/tools/supplier/orders",
            content=b'{"quantity": NaN}',
            headers={**effect_headers(tenant, "buyer-02", key), "Content-Type": "application/json"},
        )
        assert_problem(bad, 400, "bad_json")
        seen["bad_json", "http", "buyer-02", ORDERS] += 1
        # Over MCP: a tool result with a reason.
        body, headers = mcp_call(tenant, "buyer-03", "nowhere__tool")
        called = await http.post("/mcp", content=body, headers=headers)
        assert called.status_code == 200, called.text
        result = called.json()["result"]
        assert result["isError"] and result["structuredContent"]["reason"] == "unknown_route"
        seen["unknown_route", "mcp", "buyer-03", "(unknown tool)"] += 1
        # Over MCP, before the SDK reads the call: a JSON-RPC error, an MCP refusal still.
        nan_body = body.replace(b'"arguments": {}', b'"arguments": {"q": NaN}')
        nan = await http.post("/mcp", content=nan_body, headers=headers)
        assert_mcp_refusal(nan, 400, "bad_json")
        seen["bad_json", "mcp", "buyer-03", "POST /mcp"] += 1
    # A caller the gateway cannot name is no agent of the tenant: not counted.
    gone = await http.post("/v1/escalations/nope/approve", headers={"Authorization": "Bearer x"})
    assert gone.status_code == 401
    return seen


async def counted(http: httpx.AsyncClient, admin: dict[str, str], tenant: Tenant) -> dict[str, Any]:
    response = await http.get(f"/v1/admin/tenants/{tenant.id}/refusals?minutes=5", headers=admin)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def rows_of(view: dict[str, Any]) -> Counter[tuple]:
    return Counter(
        {(r["reason"], r["transport"], r["agent"], r["route"]): r["count"] for r in view["rows"]}
    )


async def test_refusals_are_counted_alike_by_every_worker_and_host(
    refusals_tenant: Tenant, gateway: Gateway, peer_gateway: Gateway
) -> None:
    tenant = refusals_tenant
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection, any worker
    hosts = (gateway, peer_gateway)
    clients = [
        httpx.AsyncClient(base_url=g.url, timeout=30, trust_env=False, limits=limits) for g in hosts
    ]
    try:
        sent = sum(
            await asyncio.gather(*(refuse_all_kinds(c, tenant, 4) for c in clients)), Counter()
        )
        assert sum(sent.values()) == 56
        deadline = time.monotonic() + 30
        while True:
            # Each host read with its own admin credential, as its operator would.
            views = [await counted(c, g.admin, tenant) for c, g in zip(clients, hosts, strict=True)]
            if all(rows_of(v) == sent for v in views) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    finally:
        for client in clients:
            await client.aclose()
    for view in views:
        assert rows_of(view) == sent, (view["rows"], sent)
        assert view["total"] == 56 and view["minutes"] == 5 and view["flush_s"] == 1.0
        assert sum(m["count"] for m in view["per_minute"]) == 56
        assert len(view["per_minute"]) == 5
        by_reason = {r["reason"]: r["count"] for r in view["by_reason"]}
        assert by_reason == {
            "per_effect_cap": 8,
            "budget_exceeded": 8,
            "route_not_allowed": 8,
            "unknown_route": 16,
            "bad_json": 16,
        }
        assert {r["transport"]: r["count"] for r in view["by_transport"]} == {"http": 40, "mcp": 16}
    # The host and the worker that answer do not matter: the counts are the fleet's.
    assert views[0] == {**views[1], "until": views[0]["until"]}


async def test_a_flood_of_refusals_is_one_write_a_flush(
    redis_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 refusals of a worker are 5,000 dict increments and, at its next flush, one
    call of the ledger (one round trip for every tenant): never a write each."""
    ledger = Ledger.from_url(redis_url)
    tally = RefusalTally(max_keys=64)
    flusher = Flusher(tally, ledger, interval_s=60)
    calls: list[int] = []
    add = ledger.refusals.add

    async def counting_add(minute: int, counts: Any) -> int:
        calls.append(sum(len(batch) for batch in counts.values()))
        return await add(minute, counts)

    monkeypatch.setattr(ledger.refusals, "add", counting_add)
    try:
        for i in range(5000):
            tally.note(tenant, f"agent-{i % 100}", ORDERS, "budget_exceeded", "http")
        # Bounded in memory: 64 keys, then the fallback of the reason.
        assert len(tally.pending) == 65
        await flusher.flush()
        await flusher.flush()  # nothing new: nothing sent
        assert calls == [65]
        now_ms = await ledger.now_ms()
        minute = now_ms // 60_000
        read = await ledger.refusals.read(tenant, [minute - 1, minute])
    finally:
        await ledger.aclose()
    assert sum(c.count for batch in read.values() for c in batch) == 5000


async def test_counts_wait_in_memory_while_redis_is_away(redis_url: str, tenant: str) -> None:
    """A flush that cannot reach Redis keeps its counts (bounded) for the next one."""
    away = Ledger.from_url(f"redis://127.0.0.1:{free_port()}/0")
    live = Ledger.from_url(redis_url)
    tally = RefusalTally()
    flusher = Flusher(tally, away, interval_s=60)
    try:
        for _ in range(3):
            tally.note(tenant, "buyer-01", ORDERS, "per_effect_cap", "http")
        await flusher.flush()
        assert tally.pending == {(tenant, "per_effect_cap", "http", "buyer-01", ORDERS): 3}
        tally.note(tenant, "buyer-01", ORDERS, "per_effect_cap", "http")
        flusher.ledger = live  # Redis is back
        await flusher.flush()
        assert tally.pending == {}
        minute = (await live.now_ms()) // 60_000
        read = await live.refusals.read(tenant, [minute - 1, minute])
    finally:
        await away.aclose()
        await live.aclose()
    assert sum(c.count for batch in read.values() for c in batch) == 4
