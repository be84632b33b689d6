"""Credential leakage: a tool whose upstream needs a secret the gateway adds (here a
bearer token read from a secret file; the supplier's `/secure` API answers 401
without it). The run drives every path an effect can take (admitted, replayed,
read, ambiguous then retried, timed out then reconciled, escalated then approved,
in progress, denied, refused as bad input), then searches everything the agent or
an operator can see: each answer the agent got, the gateway's log files, every key
of the tenant in Redis (holds, their stored requests and answers, the journal) and
/metrics. Neither the secret nor the agent's own token may appear anywhere."""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import httpx

from irrev.harness import PolicyDraft

from ..bench import Run, order_routes
from ..checks import check_ledger, snapshot
from ..matrix import Cell

TOOL = "secure"


async def _secure_tool(run: Run) -> str:
    """Give the run's tenant the `secure` tool with a fresh secret; returns it."""
    secret = f"sk_faults_{secrets.token_hex(16)}"
    path = run.bench.workdir / "secrets" / run.tenant
    path.parent.mkdir(exist_ok=True)
    path.write_text(secret + "\n")
    response = await run.bench.http.post(
        f"{run.bench.supplier.url}/_secure", json={"token": secret}
    )
    response.raise_for_status()
    policy = PolicyDraft.read(run.bench.policy_dir / f"{run.tenant}.yaml")
    policy.document["tools"][TOOL] = {
        "upstream": f"{run.bench.supplier.url}/secure",
        "credentials": {"Authorization": {"file": str(path), "prefix": "Bearer "}},
    }
    policy.document["routes"] += order_routes(TOOL)
    policy.write(run.bench.policy_dir)
    await run.reload()
    return secret


def _expect(what: str, got: object, want: object) -> list[str]:
    return [] if got == want else [f"{what}: got {got!r}, want {want!r}"]


async def _drive(run: Run) -> tuple[list[httpx.Response], list[str], list[str]]:
    """Every kind of exchange; (the answers, the hold ids, violations of the flow)."""
    answers: list[httpx.Response] = []
    found: list[str] = []

    async def order(key: str, want: int, **kwargs: Any) -> httpx.Response:
        response = await run.order(key, tool=TOOL, **kwargs)
        answers.append(response)
        found.extend(_expect(f"order {key[:6]} status", response.status_code, want))
        return response

    keys = [uuid.uuid4().hex for _ in range(5)]
    await order(keys[0], 201)
    await order(keys[0], 201)  # a replay
    await run.faults(status=503, apply=True, times=1)
    await order(keys[1], 502)
    await order(keys[1], 201)  # the retry of an ambiguous hold
    await run.faults(delay_s=1.6, apply=True, times=1)
    await order(keys[2], 504)
    report = await run.reconcile()  # the lookup carries the credential too
    found += _expect("reconciled", run.hold_id(keys[2], tool=TOOL) in report["posted"], True)
    escalated = await order(keys[3], 202, unit_price=200)
    approved = await run.admin("POST", f"{escalated.headers['location']}/approve")
    answers.append(approved)
    found += _expect("approved status", approved.status_code, 201)
    await order(keys[4], 403, unit_price=600)  # above the agent's per-effect cap
    base = f"{run.url()}/tools/{TOOL}"
    for method, path, headers, body in (
        ("GET", "/orders/o-1", {}, None),  # a read
        ("POST", "/orders", {"Idempotency-Key": "bad json"}, b"{"),
        ("POST", "/orders", {}, b"{}"),  # no Idempotency-Key
        ("POST", "/nowhere", {"Idempotency-Key": "x"}, b"{}"),  # unknown route
    ):
        sent = {**run.agent_headers(), "Content-Type": "application/json", **headers}
        answers.append(
            await run.bench.http.request(method, base + path, headers=sent, content=body)
        )
    holds = [run.hold_id(k, tool=TOOL) for k in keys[:4]]
    return answers, holds, found


def _leaks(where: str, text: str, needles: dict[str, str]) -> list[str]:
    return [f"{name} found in {where}" for name, needle in needles.items() if needle in text]


async def _search(run: Run, answers: list[httpx.Response], needles: dict[str, str]) -> list[str]:
    found = []
    for response in answers:
        seen = response.text + str(response.headers.raw)
        found += _leaks(f"an answer ({response.status_code})", seen, needles)
    for log in sorted(run.bench.workdir.glob("gateway-*.log")):
        found += _leaks(log.name, log.read_text(errors="replace"), needles)
    store = await snapshot(run)
    found += _leaks("the tenant's Redis keys", str(store.content), needles)
    metrics = await run.bench.http.get(f"{run.url()}/metrics", headers=run.admin_headers())
    found += _leaks("/metrics", metrics.text, needles)
    return found


async def no_leak(run: Run) -> list[str]:
    secret = await _secure_tool(run)
    without = await run.bench.http.post(f"{run.bench.supplier.url}/secure/orders", json={})
    found = _expect("the upstream without the secret", without.status_code, 401)
    answers, holds, flow = await _drive(run)
    found += flow
    needles = {"the tool's secret": secret, "the agent's token": run.tokens[run.tenant]["buyer-01"]}
    found += await _search(run, answers, needles)
    return found + await check_ledger(run, holds, max_forwards=2)


CELLS = [
    Cell(
        name="credentials.no_leak",
        checked="tool secret injected (401 without it); after admit, replay, retry, reconcile, "
        "approval, denial and errors: no secret or agent token in answers, logs, Redis, metrics",
        body=no_leak,
    ),
]
