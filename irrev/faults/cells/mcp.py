"""MCP tools under faults: the run's tenant gets an MCP server (irrev/upstreams/
mcp_tools.py, in a process of its own per run, deduplicating and counting by the key
irrev sends in `_meta`) and a `CALL procure/place_order` route; agents are the SDK's
MCP client. SIGKILL of a gateway worker after the reserve, from outside while the
server holds the call (before it answers) and after the server answered, k
concurrent approvals of one escalated call, and the MCP server itself SIGKILLed
mid-call. Each run checks the ledger (audit, no account over its limit)
and every hold against what the server made: posted iff made, at most one call per
key, ambiguous never released on a guess."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.edge.wire import hold_id_for, upstream_key
from gateway.state.mcp_upstream import KEY_META
from irrev.harness import PolicyDraft, Server
from irrev.stack import mcp_tools_server
from ledger import audit_tenant

from ..bench import BenchSpec, Run
from ..matrix import Cell
from .crash import _armed

TWO = BenchSpec(gateways=2)
ROUTE_ID = "procure CALL /place_order"
TOOL = "procure__place_order"
APPROVALS = 8
DIE_TIMEOUT_S = 10.0
EFFECT_TIMEOUT_S = 20.0
ROUTE = {
    "tool": "procure",
    "route": "CALL procure/place_order",
    "class": "irreversible",
    "body": ["supplier_id", "sku", "quantity", "unit_price"],
    "face_value": "quantity * unit_price",
    "risk_factors": ["supplier:{supplier_id}"],
    "approval_threshold": "300",
    "lookup": "CALL procure/find_effect",
    # The approvals cell races k approvals after the pending answer, not during a wait.
    "escalation_wait": "0",
}


@dataclass
class Tools:
    """The run's MCP server process and its state (kept across a restart)."""

    server: Server
    state: Path

    @property
    def url(self) -> str:
        return self.server.url


def start_tools(state: Path, log: Path, port: int = 0) -> Tools:
    """The server `irrev.stack` runs for the bench and the demo, started here so that
    the cell can SIGKILL it and start it again on its port and state."""
    server = mcp_tools_server(state, port, log)
    server.start("/ready")
    return Tools(server, state)


@contextlib.asynccontextmanager
async def mcp_tenant(run: Run) -> AsyncIterator[Tools]:
    """The run's tenant with an MCP server; the server stops when the block ends."""
    where = run.bench.workdir / "mcp" / run.tenant
    where.mkdir(parents=True)
    tools = await asyncio.to_thread(start_tools, where / "state", where / "tools.log")
    try:
        policy = PolicyDraft.read(run.bench.policy_dir / f"{run.tenant}.yaml")
        policy.document["tools"]["procure"] = {"mcp": f"{tools.url}/{run.tenant}/mcp"}
        policy.document["routes"].append(ROUTE)
        policy.write(run.bench.policy_dir)
        await run.reload()
        yield tools
    finally:
        await asyncio.to_thread(tools.server.stop)


async def call(run: Run, key: str, *, gateway: int = 0, quantity: int = 2) -> types.CallToolResult:
    """One agent's tools/call through a gateway (raises if no answer comes)."""
    arguments = {"supplier_id": "s1", "sku": "bolts", "quantity": quantity, "unit_price": 5}
    headers = run.agent_headers()
    meta: types.RequestParamsMeta = {KEY_META: key}  # type: ignore[misc]
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0, trust_env=False) as http,
        Client(
            streamable_http_client(f"{run.url(gateway)}/mcp", http_client=http), cache=None
        ) as client,
    ):
        return await client.session.call_tool(TOOL, arguments, meta=meta)


def hold_of(run: Run, key: str) -> str:
    return hold_id_for(run.tenant, "buyer-01", ROUTE_ID, key)


async def stats(run: Run, tools: Tools) -> dict[str, Any]:
    response = await run.bench.http.get(f"{tools.url}/{run.tenant}/_stats")
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


async def check(run: Run, tools: Tools, made: dict[str, bool]) -> list[str]:
    """The ledger audits and no account is over its limit; each hold is posted iff the
    server made its effect (`made`: what the server's stats said), never released if
    it was made, asked at most once per key."""
    ledger = run.bench.ledger
    found = [f"audit: {m}" for m in (await audit_tenant(ledger, run.tenant)).mismatches]
    for balance in await ledger.balances(run.tenant):
        if balance.used > balance.limit:
            found.append(f"{balance.account} over its limit: {balance.used} > {balance.limit}")
    seen = await stats(run, tools)
    for hold_id, was_made in made.items():
        hold = await ledger.hold(run.tenant, hold_id)
        state = hold.state.value if hold else "lost"
        calls = seen["calls_by_key"].get(upstream_key(hold_id), 0)
        if calls > 1:
            found.append(f"hold {hold_id} called {calls} times")
        if was_made and state in ("voided", "expired", "rejected"):
            found.append(f"hold {hold_id} {state} although the server made the effect")
        if not was_made and state == "posted":
            found.append(f"hold {hold_id} posted although the server never made it")
    return found


async def _took_effect(run: Run, tools: Tools, request: asyncio.Future[Any]) -> list[str]:
    """Wait until the server made the call's effect (it then holds the call); a
    violation if the call ended first or the effect never came."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EFFECT_TIMEOUT_S
    while not (await stats(run, tools))["effects"]:
        if request.done() or loop.time() > deadline:
            request.cancel()
            return ["the call never took effect at the MCP server"]
        await asyncio.sleep(0.02)
    return []


async def _died(run: Run, request: asyncio.Future[types.CallToolResult]) -> list[str]:
    try:
        result = await request
    except Exception:
        pass
    else:
        return [f"the crashing worker answered: {result.model_dump_json()[:200]}"]
    dead = await asyncio.to_thread(run.bench.gateways[1].wait_dead, DIE_TIMEOUT_S)
    return [] if dead else ["the worker did not die at its crash point"]


async def _crash(run: Run, point: str, final: str, *, mid_call: bool = False) -> list[str]:
    """Gateway 1 dies at `point`; or, `mid_call`, is SIGKILLed from outside while the
    server holds the call (its effect made, no answer yet)."""
    await _armed(run, point)
    async with mcp_tenant(run) as tools:
        if mid_call:
            await run.bench.http.post(
                f"{tools.url}/{run.tenant}/_faults", json={"hang_after_effect": True}
            )
        key = uuid.uuid4().hex
        hold_id = hold_of(run, key)
        request = asyncio.ensure_future(call(run, key, gateway=1))
        if mid_call:
            if missed := await _took_effect(run, tools, request):
                return missed
            await asyncio.to_thread(run.bench.gateways[1].kill)
        found = await _died(run, request)
        await run.bench.start_gateway(1, run.bench.gateways[1].crash_at)
        await run.wait_past_deadlines()
        await run.reconcile(gateway=1)
        state = await run.hold_state(hold_id)
        if state != final:
            found.append(f"after reconciling the hold is {state!r}, want {final!r}")
        before = (await stats(run, tools))["calls"]
        retry = await call(run, key, gateway=0)
        if (await stats(run, tools))["calls"] != before:
            found.append("the agent's retry called the server again for a settled hold")
        if final == "posted" and retry.is_error:
            found.append(f"the retry of a posted call got an error: {retry.structured_content}")
        made = upstream_key(hold_id) in (await stats(run, tools))["calls_by_key"]
        # place_order makes its effect when it is called: called is made.
        found += await check(run, tools, {hold_id: made})
        if mid_call:
            # Its handler still hangs after the effect: a SIGTERM would wait for it.
            await asyncio.to_thread(tools.server.kill)
        return found


async def after_reserve(run: Run) -> list[str]:
    return await _crash(run, "after_reserve", "voided")


async def before_upstream_answer(run: Run) -> list[str]:
    # after_claim: a point the call (not escalated) never reaches.
    return await _crash(run, "after_claim", "posted", mid_call=True)


async def after_upstream_answer(run: Run) -> list[str]:
    return await _crash(run, "after_upstream_2xx", "posted")


async def approvals(run: Run) -> list[str]:
    """k approvals of one escalated call, split over both gateways: one wins, and the
    server is called once; the agent's repeat gets the real result."""
    await run.bench.disarm()
    async with mcp_tenant(run) as tools:
        key = uuid.uuid4().hex
        pending = await call(run, key, quantity=80)  # 400 USD: above the threshold
        content = pending.structured_content or {}
        if content.get("status") != "escalated":
            return [f"the call was not escalated: {content}"]
        path = f"/v1/escalations/{content['escalation']}/approve"
        answers = await asyncio.gather(
            *(run.admin("POST", path, gateway=i % 2) for i in range(APPROVALS))
        )
        codes = sorted(a.status_code for a in answers)
        found = [] if codes == [200] + [409] * (APPROVALS - 1) else [f"approvals: {codes}"]
        result = await call(run, key, quantity=80)
        if result.is_error:
            found.append(f"the repeat after approval got {result.structured_content}")
        seen = await stats(run, tools)
        if seen["calls"] != 1:
            found.append(f"the server was called {seen['calls']} times")
        return found + await check(run, tools, {hold_of(run, key): True})


async def upstream_kill(run: Run) -> list[str]:
    """The server makes the effect and is SIGKILLed before it answers: ambiguous,
    unresolved while it is down (never released on a guess), posted once it is back
    and its lookup tool says the key took effect."""
    await run.bench.disarm()
    async with mcp_tenant(run) as tools:
        await run.bench.http.post(
            f"{tools.url}/{run.tenant}/_faults", json={"hang_after_effect": True}
        )
        key = uuid.uuid4().hex
        hold_id = hold_of(run, key)
        request = asyncio.ensure_future(call(run, key))
        if missed := await _took_effect(run, tools, request):
            await asyncio.to_thread(tools.server.kill)
            return missed
        await asyncio.to_thread(tools.server.kill)
        result = await request
        found = []
        reason = (result.structured_content or {}).get("reason")
        if reason != "upstream_ambiguous":
            found.append(f"the agent was told {reason!r}, want upstream_ambiguous")
        report = await run.reconcile()
        if hold_id not in report["unresolved"]:
            found.append(f"with the server down the hold was settled: {report}")
        log = tools.server.log_path or tools.state.with_suffix(".log")
        restarted = await asyncio.to_thread(start_tools, tools.state, log, tools.server.port)
        tools.server = restarted.server
        await run.wait_past_deadlines()
        await run.reconcile()
        state = await run.hold_state(hold_id)
        if state != "posted":
            found.append(f"after the server came back the hold is {state!r}, want 'posted'")
        return found + await check(run, tools, {hold_id: True})


CHECKED = "audit, limits, posted iff the MCP server made it, one call per key"
CELLS = [
    Cell(
        name="mcp.crash_after_reserve",
        checked=f"{CHECKED}; -> voided",
        body=after_reserve,
        spec=TWO,
        slow=True,
    ),
    Cell(
        name="mcp.crash_before_upstream_answer",
        checked=f"{CHECKED}; -> posted",
        body=before_upstream_answer,
        spec=TWO,
        slow=True,
    ),
    Cell(
        name="mcp.crash_after_upstream_answer",
        checked=f"{CHECKED}; -> posted",
        body=after_upstream_answer,
        spec=TWO,
        slow=True,
    ),
    Cell(
        name="mcp.approvals",
        checked=f"{CHECKED}; one of {APPROVALS} wins",
        body=approvals,
        spec=TWO,
        slow=True,
    ),
    Cell(
        name="mcp.upstream_kill",
        checked=f"{CHECKED}; ambiguous -> posted",
        body=upstream_kill,
        spec=TWO,
        slow=True,
    ),
]
