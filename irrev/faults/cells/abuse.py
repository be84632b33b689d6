"""One agent cannot degrade its tenant (issue 26): a shadow route's effect above every
cap leaves the enforced routes admitted; one agent's flood of escalations leaves at
most its `max_escalations` waiting while another agent still escalates; and heavy
bodies sent as fast as four senders can are refused while an honest agent's orders
are admitted, posted, and answered within 5x the time they take alone."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from irrev.harness import PolicyDraft

from ..bench import BenchSpec, Run
from ..checks import check_ledger
from ..matrix import Cell

DEPLOY = {"tool": "deploy", "method": "POST", "path": "/deploys"}
# The honest agent's orders, alone and under attack; and how many senders attack.
HONEST_ORDERS = 40
SENDERS = 4
SLOWER_AT_MOST = 5.0  # the bound on the honest p50 under attack


async def rewrite(run: Run, change: Callable[[dict[str, Any]], None]) -> None:
    """The run's tenant policy changed by `change`, written and loaded."""
    policy = PolicyDraft.read(run.bench.policy_dir / f"{run.tenant}.yaml")
    change(policy.document)
    policy.write(run.bench.policy_dir)
    await run.reload()


def supplier_orders(document: dict[str, Any]) -> dict[str, Any]:
    route: dict[str, Any] = next(
        r for r in document["routes"] if r["tool"] == "supplier" and r["route"] == "POST /orders"
    )
    return route


async def shadow_isolation(run: Run) -> list[str]:
    await rewrite(run, lambda document: supplier_orders(document).update(mode="shadow"))
    # 1,000 x 50 USD: above the agent's 500 USD cap and the tenant's whole 1,000 USD.
    huge = await run.order(uuid.uuid4().hex, quantity=1000, unit_price=50)
    found = []
    if huge.status_code != 201 or huge.headers.get("x-irrev-shadow-decision") != "deny":
        found.append(f"the shadow order: {huge.status_code} {huge.text[:160]}")
    deploys = []
    for i in range(3):
        deploy = await run.bench.http.post(
            f"{run.url()}/v1/holds",
            json=DEPLOY,
            headers={**run.agent_headers("buyer-02"), "Idempotency-Key": f"deploy-{i}"},
        )
        if deploy.status_code != 201:
            found.append(f"an enforced deploy after it: {deploy.status_code} {deploy.text[:160]}")
        else:
            deploys.append(deploy.json()["hold"])
    balances = {b.account: b for b in await run.bench.ledger.balances(run.tenant)}
    enforced = balances[f"tenant:{run.tenant}"]
    if enforced.used != len(deploys) * 5 * 10**6:
        found.append(f"the enforced tenant account holds {enforced.used}, not the deploys'")
    for hold in deploys:  # the in-process tool decided not to deploy after all
        voided = await run.bench.http.post(
            f"{run.url()}/v1/holds/{hold}/void", headers=run.agent_headers("buyer-02")
        )
        if voided.status_code != 200:
            found.append(f"voiding deploy {hold}: {voided.status_code} {voided.text[:160]}")
    # check_ledger's no-overdraw check reads the enforced accounts; the twins may be over.
    return found + [v for v in await check_ledger(run) if "shadow:" not in v]


async def escalation_flood(run: Run) -> list[str]:
    def every_order_escalates(document: dict[str, Any]) -> None:
        supplier_orders(document)["approval_threshold"] = "1"
        document["accounts"]["tenant"]["limit"] = "100000"
        document["accounts"]["principals"]["procurement"]["limit"] = "100000"
        document["accounts"]["risk_factors"]["supplier:*"]["limit"] = "100000"
        document["max_escalations"] = 20

    await rewrite(run, every_order_escalates)
    flood = await asyncio.gather(*(run.order(f"flood-{i}") for i in range(60)))
    statuses = [r.status_code for r in flood]
    found = []
    if statuses.count(202) != 20 or statuses.count(429) != 40:
        found.append(f"the flood: {statuses.count(202)} escalated, {statuses.count(429)} refused")
    other = await run.order("other", agent="buyer-02")
    if other.status_code != 202:
        found.append(f"another agent's escalation: {other.status_code} {other.text[:160]}")
    queue = await run.admin("GET", f"/v1/admin/tenants/{run.tenant}/escalations?limit=200")
    waiting = [item["agent"] for item in queue.json()["escalations"]]
    if waiting.count("buyer-01") > 20:
        found.append(f"buyer-01 keeps {waiting.count('buyer-01')} escalations waiting")
    return found + await check_ledger(run)


async def heavy_bodies(run: Run) -> list[str]:
    def roomy(document: dict[str, Any]) -> None:
        document["accounts"]["tenant"]["limit"] = "100000"
        document["accounts"]["principals"]["procurement"]["limit"] = "100000"
        document["accounts"]["risk_factors"]["supplier:*"]["limit"] = "100000"

    await rewrite(run, roomy)
    alone = await honest_p50(run, "alone")
    stop = asyncio.Event()
    refused: list[int] = []
    senders = [asyncio.create_task(send_heavy(run, i, stop, refused)) for i in range(SENDERS)]
    try:
        attacked = await honest_p50(run, "attacked")
    finally:
        stop.set()
        await asyncio.gather(*senders)
    run.notes["honest_p50_ratio"] = attacked.p50 / alone.p50
    run.notes["heavy_bodies_refused"] = len(refused)
    found = alone.failures + attacked.failures
    if attacked.p50 > SLOWER_AT_MOST * alone.p50:
        found.append(f"honest p50 {attacked.p50:.3f} s under attack, {alone.p50:.3f} s alone")
    if not refused or set(refused) - {413}:
        found.append(f"heavy bodies answered {sorted(set(refused))}, not 413")
    return found + await check_ledger(run)


class Honest:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures: list[str] = []

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)


async def honest_p50(run: Run, label: str) -> Honest:
    """The honest agent's orders one after another: each admitted and posted."""
    honest = Honest()
    for i in range(HONEST_ORDERS):
        started = time.perf_counter()
        response = await run.order(f"{label}-{i}", agent="buyer-02", timeout_s=10.0)
        honest.latencies.append(time.perf_counter() - started)
        if response.status_code != 201:
            honest.failures.append(f"honest order {label}-{i}: {response.status_code}")
    return honest


async def send_heavy(run: Run, sender: int, stop: asyncio.Event, answers: list[int]) -> None:
    """~1 MB bodies (a 60,000-key object, a 1 MB string) as fast as one sender can."""
    keys = {f"k{i}": i for i in range(60_000)}
    bodies = [
        json.dumps({**keys, "supplier_id": "s1"}).encode(),
        json.dumps({"supplier_id": "s1", "sku": "x" * 1_000_000, "quantity": 1}).encode(),
    ]
    sent = 0
    while not stop.is_set():
        response = await run.bench.http.post(
            f"{run.url()}/tools/supplier/orders",
            content=bodies[sent % 2],
            headers={
                **run.agent_headers("buyer-01"),
                "Idempotency-Key": f"heavy-{sender}-{sent}",
                "Content-Type": "application/json",
            },
        )
        answers.append(response.status_code)
        sent += 1


HEAVY = BenchSpec(max_body_bytes=2 << 20)


def _cell(
    name: str, checked: str, body: Callable[[Run], Awaitable[list[str]]], slow: bool = False
) -> Cell:
    # Only the heavy bodies need a bench that reads a megabyte; the others share the
    # default bench with the other groups' cells.
    spec = HEAVY if name == "heavy_bodies" else BenchSpec()
    return Cell(name=f"abuse.{name}", checked=checked, body=body, spec=spec, slow=slow)


CELLS = [
    _cell(
        "shadow_isolation",
        "a shadow order above every cap; enforced deploys admitted, enforced accounts untouched",
        shadow_isolation,
    ),
    _cell(
        "escalation_flood",
        "60 escalations from one agent: 20 wait, 40 escalation_cap; another agent escalates",
        escalation_flood,
    ),
    _cell(
        "heavy_bodies",
        "4 senders of ~1 MB bodies: all 413; honest orders posted, p50 within 5x alone",
        heavy_bodies,
        slow=True,  # two rounds of 40 honest orders, one of them under attack
    ),
]
