"""The contracts under concurrency and crashes, with real MCP sessions as agents: 50
agents against one tenant budget never overdraw and every effect the server made is
a posted hold; one key from 16 sessions is one call upstream; an MCP server
SIGKILLed mid-call leaves the hold ambiguous, never released on a guess, until the
reconciler learns from the restarted server what happened."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.types import CallToolResult

from tests.gateway.helpers import assert_no_overdraw, balances, holds_in, ledger_audit, used

from .conftest import (
    FLEET,
    KEY_META,
    McpGateway,
    agent,
    key,
    order,
    serve,
    start_tool_server,
    structured,
    text_of,
    tool_stats,
    write_mcp_policy,
)

# Slow (fifty agents, killed servers): .ci/run runs it, README's test command does not.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]


async def test_fifty_agents_against_one_budget_never_overdraw(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("fleet")
    agents = [f"fleet-{i:02d}" for i in range(FLEET)]
    suppliers = itertools.cycle(["s1", "s2", "s3"])
    quantities = itertools.cycle([20, 40, 60, 80])  # 2000 to 8000 USD each

    async def run(name: str) -> list[dict[str, object]]:
        outcomes = []
        async with agent(mcp_gateway.url, tenant.auth(name)) as client:
            for _ in range(3):
                arguments = order(quantity=next(quantities), supplier_id=next(suppliers))
                result = await client.call_tool("procure__place_order", arguments, meta=key())
                text = text_of(result.content[0]) if result.content else ""
                outcomes.append(
                    {"error": result.is_error, "text": text, **(result.structured_content or {})}
                )
        return outcomes

    results = [o for batch in await asyncio.gather(*(run(a) for a in agents)) for o in batch]
    admitted = [r for r in results if not r["error"]]
    escalated = [r for r in results if r.get("status") == "escalated"]
    denied = [r for r in results if r.get("reason") == "budget_exceeded"]
    # 150 calls ask for far more than the tenant's 100000 USD: every outcome occurs,
    # and nothing else (no ambiguity, no internal error).
    assert admitted and denied, results
    assert len(admitted) + len(escalated) + len(denied) == len(results), results
    # A denial tells the model why, what the call costs and what is left.
    for denial in denied:
        assert isinstance(denial["price"], int) and isinstance(denial["available"], int)
        text = str(denial["text"])
        assert text.startswith("irrev did not make this call: This call is priced "), denial
        assert " USD left this window" in text and "The budget renews at " in text, denial
        assert str(denial["price"]) not in text and str(denial["available"]) not in text
    rows = await balances(http, mcp_gateway.gateway.admin, tenant)
    assert_no_overdraw(rows)
    posted = await holds_in(http, mcp_gateway.gateway.admin, tenant, "posted")
    stats = await tool_stats(tools_http, tenant)
    assert stats["effects"] == len(posted) == len(admitted)
    assert set(stats["calls_by_key"]) == {f"irrev-{hold}" for hold in posted}
    assert used(rows)[f"tenant:{tenant.id}"] > 0
    audit = ledger_audit(mcp_gateway.gateway.redis_url, tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_one_key_from_sixteen_sessions_is_one_call(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("one-key")
    meta = key(f"tool-call-{uuid.uuid4().hex}")

    async def session() -> CallToolResult:
        async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
            return await client.call_tool("procure__place_order", order(), meta=meta)

    results = await asyncio.gather(*(session() for _ in range(16)))
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls"] == 1 and stats["effects"] == 1
    ok = [r for r in results if not r.is_error]
    # The others were told the call is in flight (same key, retry later) or got the
    # recorded result; none got a second effect.
    busy = [r for r in results if r.is_error]
    assert ok
    assert all(structured(r)["reason"] == "in_flight" for r in busy)
    assert len({str(r.structured_content) for r in ok}) == 1


async def _sessions(stack: AsyncExitStack, url: str, auth: dict[str, str], n: int) -> list[Any]:
    """`n` MCP sessions opened before any call, so their calls arrive together."""
    return [await stack.enter_async_context(agent(url, auth)) for _ in range(n)]


async def test_a_repeat_of_an_ambiguous_call_is_not_resent_to_a_server_that_may_not_dedupe(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """The server declares no `dedupes`: 16 repeats of an ambiguous call answer from the
    ledger (still ambiguous, with the hold), and none reaches the server; once the
    reconciler learnt the outcome, a repeat gets it. Before, each repeat was sent."""
    tenant = mcp_gateway.tenant("retry-ledger")
    meta = key(f"tool-call-{uuid.uuid4().hex}")
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        first = await client.call_tool("procure__flaky_order", order(), meta=meta)
    assert first.is_error
    assert first.meta is not None
    hold = first.meta["dev.irrev/hold"]
    async with AsyncExitStack() as stack:
        clients = await _sessions(stack, mcp_gateway.url, tenant.auth("buyer-01"), 16)
        repeats = await asyncio.gather(
            *(c.call_tool("procure__flaky_order", order(), meta=meta) for c in clients)
        )
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls_by_key"] == {f"irrev-{hold}": 1}
    for result in repeats:
        assert result.is_error
        assert structured(result)["reason"] == "upstream_ambiguous"
        assert structured(result)["hold"] == hold
        assert structured(result)["state"] == "ambiguous"
        # Worded for an MCP caller: its key travels in _meta, not in a header.
        assert KEY_META in text_of(result.content[0])
        assert "Idempotency-Key" not in text_of(result.content[0])
    base = f"/v1/admin/tenants/{tenant.id}"
    report = (await http.post(f"{base}/reconcile", headers=mcp_gateway.gateway.admin)).json()
    assert hold in report["posted"], report
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        settled = await client.call_tool("procure__flaky_order", order(), meta=meta)
    assert not settled.is_error and structured(settled)["found"] is True
    assert (await tool_stats(tools_http, tenant))["calls_by_key"] == {f"irrev-{hold}": 1}


async def test_sixteen_repeats_of_an_ambiguous_call_to_a_deduplicating_server_send_one(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """`dedupes: true`: a repeat of an ambiguous call is sent again, one at a time (the
    ledger's retry claim); the others are told it is in flight. Before, all went."""
    tenant = mcp_gateway.tenant("retry-dedupes")
    meta = key(f"tool-call-{uuid.uuid4().hex}")
    # The first call outlives the gateway's wait: ambiguous.
    await tools_http.post(f"/{tenant.namespace}/_faults", json={"delay_s": 3})
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        first = await client.call_tool("procure__place_order", order(), meta=meta)
    assert structured(first)["reason"] == "upstream_ambiguous", first
    hold = structured(first)["hold"]
    # The retry is answered slowly, so that the other repeats arrive meanwhile.
    await tools_http.post(f"/{tenant.namespace}/_faults", json={"repeat_delay_s": 1})
    async with AsyncExitStack() as stack:
        clients = await _sessions(stack, mcp_gateway.url, tenant.auth("buyer-01"), 16)
        repeats = await asyncio.gather(
            *(c.call_tool("procure__place_order", order(), meta=meta) for c in clients)
        )
    stats = await tool_stats(tools_http, tenant)
    assert stats["calls_by_key"] == {f"irrev-{hold}": 2}  # the first call, one retry
    assert stats["effects"] == 1
    ok = [r for r in repeats if not r.is_error]
    assert len(ok) == 1, repeats
    busy = [r for r in repeats if r.is_error]
    assert all(structured(r)["reason"] == "in_flight" for r in busy), busy
    assert all(structured(r)["hold"] == hold for r in busy)
    assert all(KEY_META in text_of(r.content[0]) for r in busy)


@pytest.mark.parametrize("when", ["after_effect", "before_effect"])
async def test_server_killed_mid_call_is_ambiguous_until_reconciled(
    when: str, redis_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    tools = start_tool_server(state, tmp_path)
    policies = tmp_path / "policies"
    policies.mkdir()
    tenant = write_mcp_policy(
        policies, f"mcp-kill-{uuid.uuid4().hex[:8]}", tools.url, hold_ttl="8s"
    )
    gateway = serve(tmp_path, redis_url, policies, IRREV_UPSTREAM_TIMEOUT_S="5")
    admin = gateway.admin
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30.0) as http:
            faults = {"hang_after_effect": True} if when == "after_effect" else {"delay_s": 60}
            await http.post(f"{tools.url}/{tenant.namespace}/_faults", json=faults)
            meta = key()
            async with agent(gateway.url, tenant.auth("buyer-01")) as client:
                call = asyncio.create_task(
                    client.call_tool("procure__place_order", order(), meta=meta)
                )
                made = "effects" if when == "after_effect" else "calls"
                await _wait_for(http, tools.url, tenant.namespace, made)
                assert tools.process is not None
                os.killpg(tools.process.pid, signal.SIGKILL)
                tools.process.wait(timeout=10)
                result = await call
            assert result.is_error
            assert structured(result)["reason"] == "upstream_ambiguous"
            hold = structured(result)["hold"]
            base = f"{gateway.url}/v1/admin/tenants/{tenant.id}"
            ambiguous = (await http.get(f"{base}/holds?state=ambiguous", headers=admin)).json()
            assert [h["hold"] for h in ambiguous] == [hold]
            # The server is down: the reconciler cannot tell, so the hold stays charged.
            report = (await http.post(f"{base}/reconcile", headers=admin)).json()
            assert hold in report["unresolved"]
            restarted = start_tool_server(state, tmp_path, port=tools.port)
            try:
                report = await _reconcile_until_settled(http, base, admin, hold)
            finally:
                restarted.stop()
            settled = "posted" if when == "after_effect" else "voided"
            assert hold in report[settled], report
            audit = ledger_audit(redis_url, tenant)
            assert audit.returncode == 0, audit.stdout + audit.stderr
    finally:
        gateway.server.stop()
        tools.stop()


async def _wait_for(http: httpx.AsyncClient, url: str, namespace: str, count: str) -> None:
    """The tool server counts a call (`count` "calls") or its effect ("effects"): the
    call is in the tool, delaying, or past its effect. A fixed 0.2 s after the call was
    counted stood in for its effect, which a loaded machine may not have made by then."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (await http.get(f"{url}/{namespace}/_stats")).json()[count]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the call never reached the MCP server ({count} stayed 0)")


async def _reconcile_until_settled(
    http: httpx.AsyncClient, base: str, admin: dict[str, str], hold: str
) -> dict[str, Any]:
    """Not found voids only once the hold's deadline has passed (no call of it can
    still arrive): until then the reconciler leaves it charged."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report: dict[str, Any] = (await http.post(f"{base}/reconcile", headers=admin)).json()
        if hold not in report["unresolved"]:
            return report
        await asyncio.sleep(0.5)
    raise AssertionError(f"never settled: {report}")
