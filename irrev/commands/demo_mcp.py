"""`irrev demo-mcp`: a fleet of MCP agents through irrev, for real.

It starts an embedded Redis, an MCP server (irrev/upstreams/mcp_tools.py: orders and
repository deletions, made once per idempotency key) and the gateway with
examples/mcp-fleet.yaml. The agents are ordinary MCP clients (the SDK's, over
Streamable HTTP) with their Bearer tokens: they list their tools, then place orders
until the fleet's budget says no; a developer agent asks to delete a repository,
which waits for a human, who approves it. The table shows what irrev decided and
checks that the MCP server made exactly the calls the ledger posted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, RequestParamsMeta
from rich.table import Table

from irrev import output
from irrev.cli import CliError, bounded
from irrev.harness import PolicyDraft
from irrev.stack import DEMO_ADMIN_TOKEN, DEMO_OPERATOR, PORT_HELP, gateway, mcp_tools
from ledger import EmbeddedRedis, HoldState, Ledger, audit_tenant

EXAMPLE = Path("examples") / "mcp-fleet.yaml"
KEY_META = "dev.irrev/idempotency_key"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=bounded(int, 1, 50), default=20, help="buying agents")
    parser.add_argument("--orders", type=bounded(int, 1, 100), default=6, help="per agent")
    parser.add_argument("--port", type=bounded(int, 1, 65535), help=PORT_HELP)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def fleet_policy(directory: Path, mcp_base: str, agents: int) -> dict[str, str]:
    """The example as written, its servers at `mcp_base`, `agents` buyers and one
    developer with fresh tokens; returns the tokens by agent."""
    if not EXAMPLE.is_file():
        raise CliError(f"no {EXAMPLE} in {Path.cwd()}: run this from the irrev repository")
    policy = PolicyDraft.read(EXAMPLE)
    document = policy.document
    for tool in document["tools"].values():
        tool["mcp"] = f"{mcp_base}/{policy.tenant}/mcp"
    buyer, developer = document["agents"]["buyer-01"], document["agents"]["dev-01"]
    document["agents"] = {f"buyer-{i:02d}": dict(buyer) for i in range(1, agents + 1)}
    document["agents"]["dev-01"] = developer
    tokens = policy.fresh_tokens().tokens
    policy.write(directory, "mcp-fleet.yaml")
    return tokens


async def call(
    url: str, token: str, tool: str, arguments: dict[str, Any], key: str = ""
) -> CallToolResult:
    """One tools/call; without `key`, as desktop and IDE hosts send it (no _meta)."""
    meta: RequestParamsMeta | None = {KEY_META: key} if key else None  # type: ignore[assignment]
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0, trust_env=False) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as client,
    ):
        return await client.session.call_tool(tool, arguments, meta=meta)


async def first_escalation(admin: httpx.AsyncClient, agent: str) -> str:
    """`agent`'s escalation in the demo tenant's queue, once it is there (the buyers'
    soft-band escalations wait there too)."""
    headers = {"Authorization": f"Bearer {DEMO_ADMIN_TOKEN}"}
    for _ in range(100):
        response = await admin.get(
            "/v1/admin/tenants/mcp-fleet/escalations", params={"limit": 200}, headers=headers
        )
        waiting = [e for e in response.json()["escalations"] if e["agent"] == agent]
        if waiting:
            return str(waiting[0]["escalation"])
        await asyncio.sleep(0.1)
    raise CliError(f"{agent}'s call never reached the approval queue")


def outcome(result: CallToolResult) -> str:
    content = result.structured_content if isinstance(result.structured_content, dict) else {}
    if not result.is_error:
        return "admitted"
    # A refusal's `status` is its HTTP status (403); a pending result's is "escalated".
    if content.get("status") == "escalated":
        return "escalated"
    return str(content.get("reason") or "error")


async def buy(url: str, token: str, index: int, orders: int, tally: Counter[str]) -> None:
    for n in range(orders):
        arguments = {
            "supplier_id": ("acme-steel", "globex-metals")[(index + n) % 2],
            "sku": "bolts",
            "quantity": 10 + 10 * ((index + n) % 4),
            "unit_price": "95.50",
        }
        result = await call(url, token, "procure__place_order", arguments, uuid.uuid4().hex)
        tally[outcome(result)] += 1


async def demo(
    irrev: str, tools: str, tokens: dict[str, str], args: argparse.Namespace
) -> Counter[str]:
    console = output.console(stderr=args.json)
    url = f"{irrev}/mcp"
    headers = {"Authorization": f"Bearer {tokens['dev-01']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0, trust_env=False) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as client,
    ):
        listed = [tool.name for tool in (await client.list_tools()).tools]
    console.print(f"dev-01 sees {listed}; the buyers see the procure tools too.")
    tally: Counter[str] = Counter()
    buyers = [name for name in tokens if name.startswith("buyer-")]
    await asyncio.gather(
        *(buy(url, tokens[name], i, args.orders, tally) for i, name in enumerate(buyers))
    )
    # A desktop host sends no key: the deletion waits (the route's escalation_wait)
    # while an operator approves it from the queue, and the call returns its result.
    deletion = {"owner": "acme", "repo": "legacy-billing"}
    waiting = asyncio.create_task(
        call(url, tokens["dev-01"], "github__delete_repository", deletion)
    )
    async with httpx.AsyncClient(base_url=irrev, trust_env=False) as admin:
        escalation = await first_escalation(admin, "dev-01")
        response = await admin.post(
            f"/v1/escalations/{escalation}/approve",
            headers={"Authorization": f"Bearer {DEMO_ADMIN_TOKEN}"},
            json={"reason": "legacy-billing was migrated last week"},
        )
        console.print(
            f"dev-01's deletion waits for a person ({escalation}); {DEMO_OPERATOR}, an "
            f"operator, approves it while it waits -> {response.status_code}"
        )
        done = await waiting
        console.print(f"dev-01's call returns: {outcome(done)} ({done.content[-1].text})")  # type: ignore[union-attr]
        again = await call(url, tokens["dev-01"], "github__delete_repository", deletion)
        console.print(f"the model repeats it, still without a key: {outcome(again)}, not again")
        stats = (await admin.get(f"{tools}/mcp-fleet/_stats")).json()
    table = Table(title=f"{len(buyers)} MCP agents x {args.orders} orders, one fleet budget")
    table.add_column("outcome")
    table.add_column("calls", justify="right")
    for name, count in sorted(tally.items()):
        table.add_row(name, str(count))
    console.print(table)
    console.print(f"the MCP server made {stats['effects']} effects in {stats['calls']} calls")
    return tally


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="irrev-demo-mcp-") as scratch:
        root = Path(scratch)
        with (
            EmbeddedRedis(root / "redis") as redis,
            mcp_tools(root / "tool-state") as tools,
        ):
            tokens = fleet_policy(root / "policies", tools.url, args.agents)
            with gateway(redis.url, root / "policies", workers=2, port=args.port) as irrev:
                tally = asyncio.run(demo(irrev.url, tools.url, tokens, args))
                return asyncio.run(check(redis.url, tools.url, tally, args.json))


async def check(redis_url: str, tools: str, tally: Counter[str], as_json: bool) -> int:
    """The MCP server's effects are exactly the posted holds, and the journal audits."""
    ledger = Ledger.from_url(redis_url)
    try:
        posted = await ledger.hold_ids("mcp-fleet", HoldState.POSTED)
        report = await audit_tenant(ledger, "mcp-fleet")
    finally:
        await ledger.aclose()
    async with httpx.AsyncClient(trust_env=False) as http:
        stats = (await http.get(f"{tools}/mcp-fleet/_stats")).json()
    same = stats["effects"] == len(posted)
    ok = same and not report.mismatches
    if as_json:
        result = {
            "outcomes": dict(sorted(tally.items())),
            "server_calls": stats["calls"],
            "server_effects": stats["effects"],
            "posted_holds": len(posted),
            "audit_mismatches": [str(m) for m in report.mismatches],
            "ok": ok,
        }
        print(json.dumps(result, indent=2))
        return 0 if ok else 1
    console = output.console()
    console.print(
        f"posted holds {len(posted)}, server effects {stats['effects']}: "
        f"{'equal' if same else 'DIFFERENT'}; audit: "
        f"{'ok' if not report.mismatches else report.mismatches}"
    )
    return 0 if ok else 1
