"""`irrev demo --shadow`: what shadow mode would have denied against what enforcement
denies, on the same seed.

The demo fleet's seeded orders go one by one through two fresh stacks (Redis, the
supplier API, the gateway): the procurement tenant enforced, then in shadow mode. A
decision depends on the balances before it, and the two modes charge differently:
enforcement charges an escalated order only once a human approves it and never
charges a denied one, while shadow mode forwards and charges both. So that every
order meets the same balances in both runs, the operator of the enforced run approves
every escalation at once (the order is made and charged, as in shadow mode), and
each order shadow mode would have denied is compensated in full once it is posted
(as if cancelled and refunded: what enforcement never charged). With the same
balances before every order and the same pricing, the two runs must decide alike;
the table shows that they do, order by order, and that the ledgers end equal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from gateway.state.policies import load_demo_tokens, read_policy_file
from irrev import output
from irrev.commands.demo import Order, buyers_of, plan
from irrev.stack import DEMO_ADMIN_TOKEN, gateway, render_policies, supplier
from ledger import EmbeddedRedis, Ledger, audit_tenant
from pricing import SHADOW_PREFIX, money_text

ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_TOKEN}"}
ADMITTED = ("admit", "within_budget")


@dataclass(frozen=True)
class Decided:
    """What one mode decided about one order: `decision` and `reason` as enforcement
    gives them (for shadow mode, what it would have done); `charged` is what stayed
    on the tenant's account, in micro-USD."""

    key: str
    decision: str
    reason: str
    charged: int


@dataclass(frozen=True, kw_only=True)
class Run:
    mode: str
    decided: list[Decided]
    used: int  # the tenant account's pending + posted at the end
    limit: int
    audit_ok: bool
    supplier_orders: int
    compensated: int  # micro-USD shadow mode charged for would-be denials, given back


def compare(args: argparse.Namespace) -> int:
    console = output.console(stderr=args.json)
    with tempfile.TemporaryDirectory(prefix="irrev-demo-shadow-") as scratch:
        root = Path(scratch)
        runs = [run_mode(root, args, mode, console) for mode in ("enforce", "shadow")]
    enforce, shadow = runs
    same = sum(
        (e.decision, e.reason) == (s.decision, s.reason)
        for e, s in zip(enforce.decided, shadow.decided, strict=True)
    )
    ok = (
        same == len(enforce.decided)
        and enforce.used == shadow.used
        and enforce.audit_ok
        and shadow.audit_ok
    )
    if args.json:
        print(json.dumps(as_json(args, enforce, shadow, same, ok), indent=2))
    else:
        console.print(table(args, enforce, shadow, same))
        console.print(
            "[green]shadow mode would have decided exactly what enforcement decided[/]"
            if ok
            else "[red]the decisions differ[/]"
        )
    return 0 if ok else 1


def run_mode(root: Path, args: argparse.Namespace, mode: str, console: Console) -> Run:
    console.print(f"[bold]{mode}[/]: starting Redis, the supplier API and the gateway...")
    with EmbeddedRedis(root / f"redis-{mode}") as redis, supplier() as supplier_url:
        policies = render_policies(root / f"policies-{mode}", supplier_url, mode=mode)
        # One stack at a time: with --port, each run's gateway takes it in turn.
        with gateway(redis.url, policies, workers=1, port=args.port) as server:
            return asyncio.run(drive(server.url, redis.url, supplier_url, policies, args, mode))


async def drive(
    url: str,
    redis_url: str,
    supplier_url: str,
    policies: Path,
    args: argparse.Namespace,
    mode: str,
) -> Run:
    tokens = load_demo_tokens(policies / "procurement.tokens.yaml").tokens
    tenant = read_policy_file(policies / "procurement.yaml").tenant
    orders = plan(buyers_of(tokens, args.agents), args)
    decided = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for o in orders:
            if mode == "shadow":
                decided.append(await shadowed(http, tenant, tokens[o.agent], o))
            else:
                decided.append(await enforced(http, tokens[o.agent], o))
        supplier_orders = (await http.get(f"{supplier_url}/_stats")).json()["orders"]
    ledger = Ledger.from_url(redis_url)
    try:
        # Shadow mode holds on the accounts' shadow twins (docs/policy.md).
        account = f"{SHADOW_PREFIX if mode == 'shadow' else ''}tenant:{tenant}"
        top = await ledger.balance(tenant, account)
        audit = await audit_tenant(ledger, tenant)
    finally:
        await ledger.aclose()
    assert top is not None
    compensated = sum(d.charged for d in decided if d.decision == "deny")
    return Run(
        mode=mode,
        decided=decided,
        used=top.used,
        limit=top.limit,
        audit_ok=audit.ok,
        supplier_orders=supplier_orders,
        compensated=compensated,
    )


def _headers(token: str, o: Order) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Idempotency-Key": o.key}


async def enforced(http: httpx.AsyncClient, token: str, o: Order) -> Decided:
    response = await http.post("/tools/supplier/orders", json=o.body, headers=_headers(token, o))
    body = response.json()
    if response.status_code == 202:
        # The operator approves at once: the order is made and charged, as shadow mode
        # makes it, so both ledgers meet the next order alike.
        approved = await http.post(f"/v1/escalations/{body['escalation']}/approve", headers=ADMIN)
        approved.raise_for_status()
        return Decided(o.key, "escalate", body["reason"], int(response.headers["x-irrev-price"]))
    if response.status_code == 403:
        return Decided(o.key, "deny", body.get("ledger_reason", body["reason"]), 0)
    response.raise_for_status()
    return Decided(o.key, *ADMITTED, int(response.headers["x-irrev-price"]))


async def shadowed(http: httpx.AsyncClient, tenant: str, token: str, o: Order) -> Decided:
    response = await http.post("/tools/supplier/orders", json=o.body, headers=_headers(token, o))
    response.raise_for_status()  # shadow mode blocks nothing
    headers = response.headers
    price = int(headers["x-irrev-price"])
    if "x-irrev-shadow-decision" not in headers:
        return Decided(o.key, *ADMITTED, price)
    decision, reason = headers["x-irrev-shadow-decision"], headers["x-irrev-shadow-reason"]
    if decision == "deny":
        # Charged, as shadow mode charges what it forwards; given back in full, so that
        # the next order meets the balances enforcement (which never charged it) has.
        hold = headers["x-irrev-hold"]
        refund = await http.post(
            f"/v1/holds/{hold}/compensate",
            params={"tenant": tenant},
            json={"recovered_micros": price},
            headers=ADMIN,
        )
        refund.raise_for_status()
    return Decided(o.key, decision, reason, price)


def _usd(micros: int) -> str:
    return money_text(micros, 1_000_000, "USD")


def table(args: argparse.Namespace, enforce: Run, shadow: Run, same: int) -> Table:
    out = Table(
        title=f"irrev demo --shadow: {args.agents} agents, {args.ticks} ticks, seed {args.seed}, "
        "orders one by one"
    )
    out.add_column("")
    out.add_column("enforced", justify="right")
    out.add_column("shadow (would have)", justify="right")
    counts = [Counter((d.decision, d.reason) for d in run.decided) for run in (enforce, shadow)]
    for decision, reason in sorted(set(counts[0]) | set(counts[1])):
        label = f"{decision}: {reason}"
        out.add_row(label, str(counts[0][decision, reason]), str(counts[1][decision, reason]))
    total = len(enforce.decided)
    out.add_row("same decision and reason, order by order", f"{same} / {total}", "")
    out.add_row(
        "orders the supplier received", str(enforce.supplier_orders), str(shadow.supplier_orders)
    )
    out.add_row("charged for would-be denials, then compensated", "-", _usd(shadow.compensated))
    out.add_row(
        "tenant exposure at the end / limit",
        f"{_usd(enforce.used)} / {_usd(enforce.limit)}",
        f"{_usd(shadow.used)} / {_usd(shadow.limit)}",
    )
    out.add_row("ledger audit", _ok(enforce.audit_ok), _ok(shadow.audit_ok))
    return out


def _ok(ok: bool) -> str:
    return "ok" if ok else "MISMATCHES"


def as_json(
    args: argparse.Namespace, enforce: Run, shadow: Run, same: int, ok: bool
) -> dict[str, object]:
    def summary(run: Run) -> dict[str, object]:
        counts = Counter(f"{d.decision}: {d.reason}" for d in run.decided)
        return {
            "decisions": dict(sorted(counts.items())),
            "supplier_orders": run.supplier_orders,
            "tenant_used": run.used,
            "tenant_used_text": _usd(run.used),
            "tenant_limit": run.limit,
            "tenant_limit_text": _usd(run.limit),
            "compensated": run.compensated,
            "compensated_text": _usd(run.compensated),
            "audit_ok": run.audit_ok,
            "currency": "USD",
        }

    return {
        "seed": args.seed,
        "agents": args.agents,
        "ticks": args.ticks,
        "orders": len(enforce.decided),
        "same": same,
        "ok": ok,
        "enforce": summary(enforce),
        "shadow": summary(shadow),
        "orders_decided": [
            {"enforce": asdict(e), "shadow": asdict(s)}
            for e, s in zip(enforce.decided, shadow.decided, strict=True)
        ],
    }
