"""Settlement abuse: a hostile agent tries to settle its own effects. On proxied
holds (posted, in flight, ambiguous) it compensates, posts 0 or 2^53-1, voids,
marks ambiguous and reports realised losses, repeatedly; on an in-process hold of
an irreversible route it posts 2^53-1 and compensates. Every attempt must be a
4xx problem, and the store and the upstream (not the gateway's answers) must say
so: every effect the upstream made is charged at its price, no account is over
its limit, no learned count moved, and the journal replays."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway.edge.wire import upstream_key
from ledger import MAX_AMOUNT, audit_tenant

from ..bench import Run
from ..checks import check_ledger
from ..matrix import Cell
from .hostile import expect_4xx

PRICE = 10_000_000  # an order of 2 x 5 USD, irreversible: charged at its face value
ATTEMPTS: tuple[tuple[str, dict[str, Any] | None], ...] = (
    ("compensate", {"recovered_micros": PRICE}),
    ("compensate", {"recovered_micros": 1}),
    ("post", {"amount_micros": 0}),
    ("post", {"amount_micros": MAX_AMOUNT}),
    ("void", None),
    ("ambiguous", {}),
    ("settle", {"realised_micros": 0}),
)


async def _attack(run: Run, hold_id: str, when: str, rounds: int = 1) -> list[str]:
    found = []
    for _ in range(rounds):
        for action, body in ATTEMPTS:
            response = await run.bench.http.post(
                f"{run.url()}/v1/holds/{hold_id}/{action}", json=body, headers=run.agent_headers()
            )
            found += expect_4xx(f"{action} {body} {when}", response, (403, 422))
    return found


async def _learned(run: Run) -> int:
    counted = (await run.bench.ledger.outcomes([run.tenant]))[run.tenant]
    return sum(route.failures + route.successes for route in counted.values())


async def _charged_as_made(run: Run, made: int) -> list[str]:
    """The agent's posted balance is exactly what the upstream made, at its price."""
    balance = await run.bench.ledger.balance(run.tenant, "agent:buyer-01")
    posted = balance.posted if balance else -1
    return [] if posted == made * PRICE else [f"agent posted {posted}, upstream made {made}"]


async def proxied(run: Run) -> list[str]:
    posted_key = uuid.uuid4().hex
    if (first := await run.order(posted_key)).status_code != 201:
        return [f"the honest order got {first.status_code}"]
    found = await _attack(run, run.hold_id(posted_key), "after the post", rounds=3)

    await run.faults(delay_s=0.6, times=1)
    flight_key = uuid.uuid4().hex
    in_flight = asyncio.create_task(run.order(flight_key))
    await run.wait_forwarded(run.hold_id(flight_key))
    found += await _attack(run, run.hold_id(flight_key), "in flight")
    if (answer := await in_flight).status_code != 201:
        found.append(f"the delayed order got {answer.status_code}")

    await run.faults(status=503, apply=True, times=1)
    unsure_key = uuid.uuid4().hex
    await run.order(unsure_key)
    found += await _attack(run, run.hold_id(unsure_key), "while ambiguous", rounds=2)
    if (state := await run.hold_state(run.hold_id(unsure_key))) != "ambiguous":
        found.append(f"the ambiguous hold is {state}")

    holds = [run.hold_id(k) for k in (posted_key, flight_key, unsure_key)]
    found += await check_ledger(run, holds)
    # The ambiguous effect was made too, and stays charged, as pending until reconciled.
    made = set((await run.supplier_stats())["keys"])
    found += await _charged_as_made(run, sum(upstream_key(h) in made for h in holds[:2]))
    if learned := await _learned(run):
        found.append(f"learned counts moved by {learned}")
    return found


async def in_process(run: Run) -> list[str]:
    """The agent's own decision-API hold of an irreversible route: it may post it at
    its price, never above, and never compensate it."""
    http, url = run.bench.http, f"{run.url()}/v1/holds"
    headers = {**run.agent_headers(), "Idempotency-Key": uuid.uuid4().hex}
    spec = {"tool": "deploy", "method": "POST", "path": "/deploys"}
    created = await http.post(url, json=spec, headers=headers)
    if created.status_code != 201:
        return [f"the deploy hold got {created.status_code} {created.text[:160]}"]
    hold = f"{url}/{created.json()['hold']}"
    agent = run.agent_headers()
    found = expect_4xx(
        "post 2^53-1",
        await http.post(f"{hold}/post", json={"amount_micros": MAX_AMOUNT}, headers=agent),
        (422,),
    )
    found += expect_4xx(
        "settle",
        await http.post(f"{hold}/settle", json={"realised_micros": 0}, headers=agent),
        (403,),
    )
    posted = await http.post(f"{hold}/post", json={}, headers=agent)
    if posted.status_code != 200:
        found.append(f"the honest post got {posted.status_code}")
    for _ in range(3):
        back = await http.post(f"{hold}/compensate", json={"recovered_micros": 1}, headers=agent)
        found += expect_4xx("compensate an irreversible effect", back, (403,))
    report = await audit_tenant(run.bench.ledger, run.tenant)
    found += [f"audit: {m}" for m in report.mismatches]
    for balance in await run.bench.ledger.balances(run.tenant):
        if balance.used > balance.limit:
            found.append(f"{balance.account} over its limit: {balance.used} > {balance.limit}")
    if learned := await _learned(run):
        found.append(f"learned counts moved by {learned}")
    return found


CELLS = [
    Cell(
        name="settlement.agent_on_proxied_holds",
        checked="agent compensate/post 0/post 2^53-1/void/ambiguous/settle on posted, "
        "in-flight and ambiguous proxied holds, repeated -> 4xx; charged as made; no "
        "learning; audit",
        body=proxied,
    ),
    Cell(
        name="settlement.agent_on_irreversible_in_process",
        checked="agent post 2^53-1, settle, compensate x3 on its irreversible in-process hold -> "
        "4xx; no account over its limit; no learning; audit",
        body=in_process,
    ),
]
