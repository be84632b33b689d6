"""`irrev demo`: a correlated procurement fleet through a price spike, for real.

It starts an embedded Redis, the gateway (two workers) with the example procurement
policy, and a local supplier API that counts orders by idempotency key. Fifty buying
agents then send real HTTP orders; halfway through, the supplier's prices spike and
every agent buys at once. An operator approves a few escalations and rejects the
rest. The table compares what irrev let through with what per-agent caps alone would
have, and checks that the supplier counted exactly the orders the ledger posted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from gateway.state.policies import load_demo_tokens, read_policy_file
from irrev import output
from irrev.cli import bounded
from irrev.stack import (
    DEMO_ADMIN_TOKEN,
    DEMO_OPERATOR,
    PORT_HELP,
    gateway,
    render_policies,
    supplier,
)
from ledger import Balance, EmbeddedRedis, HoldState, Ledger, audit_tenant
from pricing import with_money_text

SUPPLIERS = ("acme-steel", "globex-metals", "initech-parts")
SKUS = ("steel-coil", "bolts", "paint")
MICROS = 1_000_000


@dataclass(frozen=True)
class Order:
    """One order of the fleet's seeded plan."""

    tick: int
    agent: str
    body: dict[str, object]
    face: int  # micro-USD

    @property
    def key(self) -> str:
        return f"demo-{self.tick}-{self.agent}"


@dataclass
class Tally:
    decisions: Counter[str] = field(default_factory=Counter)
    face_requested: int = 0  # micro-USD of every order the fleet tried
    face_local_caps: int = 0  # what per-agent caps alone would have let through
    escalations: list[str] = field(default_factory=list)
    approved: int = 0
    rejected: int = 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agents",
        type=int,
        default=50,
        choices=range(1, 51),
        metavar="1-50",
        help="buying agents in the fleet",
    )
    parser.add_argument(
        "--ticks", type=bounded(int, 1, 10_000), default=40, help="rounds of orders; a spike midway"
    )
    parser.add_argument(
        "--seed", type=bounded(int, 0), default=7, help="the seed of the fleet's orders"
    )
    parser.add_argument(
        "--approve",
        type=bounded(int, 0),
        default=3,
        help="escalations the operator approves",
    )
    parser.add_argument(
        "--shadow",
        action="store_true",
        help="send the same seeded orders one by one, enforced and in shadow mode, and "
        "compare the decisions",
    )
    parser.add_argument("--port", type=bounded(int, 1, 65535), help=PORT_HELP)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def plan(buyers: list[str], args: argparse.Namespace) -> list[Order]:
    """The fleet's orders, from the seed alone: a few per tick, then a price spike
    halfway through in which most agents buy at once."""
    rng = random.Random(args.seed)
    spike = range(args.ticks // 2, args.ticks // 2 + max(1, args.ticks // 5))
    orders = []
    for tick in range(args.ticks):
        rate, price_gain = (0.6, 2.5) if tick in spike else (0.03, 1.0)
        for agent in buyers:
            if rng.random() >= rate:
                continue
            quantity = rng.randint(1, 7)
            unit_price = round(rng.lognormvariate(8.0, 0.4) * price_gain, 2)
            body = {
                "supplier_id": rng.choice(SUPPLIERS),
                "sku": rng.choice(SKUS),
                "quantity": quantity,
                "unit_price": unit_price,
            }
            face = round(quantity * unit_price * MICROS)
            orders.append(Order(tick, agent, body, face))
    return orders


def buyers_of(tokens: dict[str, str], agents: int) -> list[str]:
    return sorted(a for a in tokens if a.startswith("buyer-"))[:agents]


def run(args: argparse.Namespace) -> int:
    if args.shadow:
        from irrev.commands.demo_shadow import compare

        return compare(args)
    console = output.console(stderr=args.json)
    with tempfile.TemporaryDirectory(prefix="irrev-demo-") as scratch:
        root = Path(scratch)
        console.print("[bold]irrev demo[/]: starting Redis, the supplier API and the gateway...")
        with EmbeddedRedis(root / "redis") as redis, supplier() as supplier_url:
            policies = render_policies(root / "policies", supplier_url)
            with gateway(redis.url, policies, workers=2, port=args.port) as server:
                console.print(f"gateway on {server.url}; {args.agents} agents buying...")
                tally = asyncio.run(fleet(server.url, policies, args))
                return asyncio.run(report(console, redis.url, supplier_url, policies, tally, args))


async def fleet(url: str, policies: Path, args: argparse.Namespace) -> Tally:
    tokens = load_demo_tokens(policies / "procurement.tokens.yaml").tokens
    policy = read_policy_file(policies / "procurement.yaml")
    tally = Tally()
    spent_local: Counter[str] = Counter()
    by_tick: dict[int, list[Order]] = {}
    for planned in plan(buyers_of(tokens, args.agents), args):
        by_tick.setdefault(planned.tick, []).append(planned)
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        for tick in sorted(by_tick):
            sending = []
            for o in by_tick[tick]:
                tally.face_requested += o.face
                cap = policy.document.agents[o.agent]
                if o.face <= cap.per_effect_cap and spent_local[o.agent] + o.face <= cap.window_cap:
                    spent_local[o.agent] += o.face
                    tally.face_local_caps += o.face
                sending.append(order(http, tokens[o.agent], o.key, o.body, tally))
            await asyncio.gather(*sending)
        await operator(http, tally, args.approve)
    return tally


async def order(
    http: httpx.AsyncClient, token: str, key: str, body: dict[str, object], tally: Tally
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    response = await http.post("/tools/supplier/orders", json=body, headers=headers)
    if response.status_code == 202:
        tally.decisions["escalated"] += 1
        tally.escalations.append(response.json()["escalation"])
    elif response.status_code == 403:
        tally.decisions[f"denied: {response.json()['reason']}"] += 1
    elif response.is_success:
        tally.decisions["admitted"] += 1
    else:
        tally.decisions[f"HTTP {response.status_code}"] += 1


async def operator(http: httpx.AsyncClient, tally: Tally, approve: int) -> None:
    """A human on the approval queue: approves the first few, rejects the rest."""
    headers = {"Authorization": f"Bearer {DEMO_ADMIN_TOKEN}"}
    for i, escalation in enumerate(tally.escalations):
        verb = "approve" if i < approve else "reject"
        response = await http.post(f"/v1/escalations/{escalation}/{verb}", headers=headers)
        if response.status_code < 300:
            tally.approved += verb == "approve"
            tally.rejected += verb == "reject"


async def report(
    console: Console,
    redis_url: str,
    supplier_url: str,
    policies: Path,
    tally: Tally,
    args: argparse.Namespace,
) -> int:
    tenant = read_policy_file(policies / "procurement.yaml").tenant
    ledger = Ledger.from_url(redis_url)
    try:
        balances = {b.account: b for b in await ledger.balances(tenant)}
        posted = await ledger.hold_ids(tenant, HoldState.POSTED)
        audit = await audit_tenant(ledger, tenant)
    finally:
        await ledger.aclose()
    async with httpx.AsyncClient() as http:
        supplier_orders = (await http.get(f"{supplier_url}/_stats")).json()["orders"]
    top = balances[f"tenant:{tenant}"]
    over = [b.account for b in balances.values() if b.used > b.limit]
    ok = not over and supplier_orders == len(posted) and audit.ok
    if args.json:
        print(json.dumps(report_json(tally, top, over, supplier_orders, len(posted), ok), indent=2))
        return 0 if ok else 1

    table = Table(title=f"irrev demo: {args.agents} agents, {args.ticks} ticks, a price spike")
    table.add_column("")
    table.add_column("value", justify="right")
    for outcome, count in sorted(tally.decisions.items()):
        table.add_row(outcome, str(count))
    table.add_row(
        f"escalations approved / rejected (by {DEMO_OPERATOR})",
        f"{tally.approved} / {tally.rejected}",
    )
    usd = lambda micros: f"${micros / MICROS:,.0f}"  # noqa: E731
    table.add_row("orders requested (face value)", usd(tally.face_requested))
    table.add_row(
        "per-agent caps alone would admit",
        f"{usd(tally.face_local_caps)} = {tally.face_local_caps / top.limit:.2f}x the limit",
    )
    table.add_row(
        "irrev: charged exposure / tenant limit",
        f"{usd(top.used)} / {usd(top.limit)} = {top.used / top.limit:.2f}x",
    )
    table.add_row("accounts over their limit", ", ".join(over) or "none")
    table.add_row("orders the supplier counted", str(supplier_orders))
    table.add_row("holds the ledger posted", str(len(posted)))
    table.add_row("ledger audit", "ok" if audit.ok else f"{len(audit.mismatches)} mismatches")
    console.print(table)
    console.print("[green]all invariants hold[/]" if ok else "[red]an invariant failed[/]")
    return 0 if ok else 1


def report_json(
    tally: Tally, top: Balance, over: list[str], supplier_orders: int, posted: int, ok: bool
) -> dict[str, object]:
    return {
        "decisions": dict(sorted(tally.decisions.items())),
        "escalations_approved": tally.approved,
        "escalations_rejected": tally.rejected,
        **with_money_text(
            {
                "face_requested": tally.face_requested,
                "face_local_caps": tally.face_local_caps,
                "tenant_used": top.used,
                "tenant_limit": top.limit,
            },
            MICROS,
            "USD",
        ),
        "accounts_over_limit": over,
        "supplier_orders": supplier_orders,
        "posted_holds": posted,
        "ok": ok,
    }
