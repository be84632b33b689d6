"""What two paths cost that grew with the fleet (issue 31, item 4), counted on a
private embedded Redis, in one process, with no background work to blur the counts:

- a reserve that meets accounts Redis lost, with `--tenants` tenants served, all of
  whose accounts were lost: how many tenants got their accounts written back (the
  ones a reload touched), and the Redis commands and round trips of that one request;
- one page of the approval queue (GET /v1/admin/tenants/{t}/escalations) with each
  of `--waiting` escalations waiting: Redis commands and round trips for the page.

Commands are INFO commandstats deltas (INFO and CONFIG left out); round trips are the
sends redis-py makes (a pipeline is one). Run it by hand from the root of a checkout:
`python -m irrev.bench.paths`. To measure another checkout's code (one before a
change), copy this file out of any package (inside irrev/bench its neighbours shadow
the `gateway` and `ledger` packages) and run the copy from that checkout's root with
PYTHONPATH=<that checkout>; the code measured is printed first. It asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from redis.asyncio.connection import AbstractConnection

import gateway
from gateway.edge.canonical import read_request
from gateway.edge.wire import StoredRequest
from gateway.pipeline.decision import Decision, admit
from gateway.pipeline.prepare import Gate, Intent, prepare
from gateway.pipeline.upstream import Answer, Fate, HttpMeta
from gateway.routes import admin_ledger
from gateway.settings import GatewaySettings
from gateway.state.tenants import TenantStore
from irrev.harness import PolicyDraft
from ledger import EmbeddedRedis, Ledger
from ledger.keys import accounts_key

EXAMPLE = Path("examples/procurement.yaml")  # run from the root of a checkout
IGNORED = {"info", "config", "config|resetstat"}
ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"


class Sends:
    """redis-py's writes to Redis connections in this process: its round trips."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        send = AbstractConnection.send_packed_command

        async def counted(
            connection: AbstractConnection, command: Any, check_health: bool = True
        ) -> None:
            self.count += 1
            await send(connection, command, check_health)

        setattr(AbstractConnection, "send_packed_command", counted)  # noqa: B010
        try:
            yield
        finally:
            setattr(AbstractConnection, "send_packed_command", send)  # noqa: B010


async def commands(ledger: Ledger) -> int:
    stats = await ledger.redis.info("commandstats")
    return sum(
        int(value["calls"])
        for name, value in stats.items()
        if name.removeprefix("cmdstat_") not in IGNORED
    )


JSON = (("content-type", "application/json"),)


@dataclass(frozen=True)
class Delivered:
    """An upstream that made every effect: nothing leaves the process."""

    key_name: str = "Idempotency-Key"
    resends: bool = True

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        return Answer(
            fate=Fate.DELIVERED,
            payload=b"{}",
            media_type="application/json",
            http=HttpMeta(201, JSON),
        )


def order_intent(key: str) -> Intent:
    body = {"supplier_id": "s1", "sku": "bolts", "quantity": 1, "unit_price": "10"}
    canonical = read_request("", ["application/json"], json.dumps(body).encode())
    return Intent(
        tool="supplier", operation="POST", target="/orders", canonical=canonical, keys=[key]
    )


async def send_order(gate: Gate, tenant: str, token: str, key: str) -> Decision:
    found = gate.tenants.authenticate(token)
    assert found is not None
    policy, agent = found
    prepared = prepare(policy, agent, order_intent(key), in_process=False)
    outcome = await admit(gate, policy, agent, prepared, Delivered())
    assert isinstance(outcome, Decision), outcome
    return outcome


def write_tenants(directory: Path, count: int, **overrides: Any) -> list[tuple[str, str]]:
    """`count` copies of the procurement example, each a tenant of its own (the
    directory's name and a number): (tenant id, buyer-01's token)."""
    written = []
    for n in range(count):
        tenant = f"{directory.name}-{n:03d}"
        policy = PolicyDraft.read(EXAMPLE).named(tenant).fresh_tokens()
        policy.point("http://127.0.0.1:9")
        policy.document.update(overrides)
        policy.write(directory)
        written.append((policy.tenant, policy.tokens["buyer-01"]))
    return written


async def serving(directory: Path, url: str) -> Gate:
    settings = GatewaySettings(policy_dir=directory, admin_tokens=f"bench={ADMIN_TOKEN}")
    ledger = Ledger.from_url(url)
    tenants = TenantStore(directory, settings.forward_budget())
    await tenants.load(ledger)
    return Gate(settings, ledger, tenants, httpx.AsyncClient())


async def lost_accounts(root: Path, url: str, tenants: int, sends: Sends) -> dict[str, int]:
    directory = root / "lost"
    directory.mkdir()
    written = write_tenants(directory, tenants)
    gate = await serving(directory, url)
    ids = [tenant for tenant, _ in written]
    await gate.ledger.redis.delete(*(accounts_key(tenant) for tenant in ids))
    await gate.ledger.redis.config_resetstat()
    before = sends.count
    tenant, token = written[0]
    await send_order(gate, tenant, token, "lost-1")
    trips = sends.count - before
    sent = await commands(gate.ledger)
    reopened = sum([await gate.ledger.redis.exists(accounts_key(t)) for t in ids])
    await gate.http.aclose()
    await gate.ledger.aclose()
    return {
        "tenants": tenants,
        "tenants_reopened": reopened,
        "commands": sent,
        "round_trips": trips,
    }


async def queue_page(root: Path, url: str, waiting: int, sends: Sends) -> dict[str, int]:
    directory = root / f"queue-{waiting}"
    directory.mkdir()
    # Every order escalates (an approval threshold of 0.01), and one agent may keep
    # all of them waiting.
    routes = PolicyDraft.read(EXAMPLE).document["routes"]
    for route in routes:
        if route["route"] == "POST /orders":
            route["approval_threshold"] = "0.01"
    ((tenant, token),) = write_tenants(directory, 1, routes=routes, max_escalations=waiting)
    gate = await serving(directory, url)
    for n in range(waiting):
        await send_order(gate, tenant, token, f"wait-{n}")
    app = FastAPI()
    app.include_router(admin_ledger.router)
    app.state.gate = gate
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
        await gate.ledger.redis.config_resetstat()
        before = sends.count
        page = await http.get(
            f"/v1/admin/tenants/{tenant}/escalations",
            params={"limit": 200},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        trips = sends.count - before
        sent = await commands(gate.ledger)
    assert page.status_code == 200, page.text
    listed = len(page.json()["escalations"])
    await gate.http.aclose()
    await gate.ledger.aclose()
    return {"waiting": waiting, "listed": listed, "commands": sent, "round_trips": trips}


async def measure(tenants: int, waiting: list[int]) -> dict[str, Any]:
    sends = Sends()
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedRedis(Path(tmp) / "redis", tcp=True) as server,
        sends.counting(),
    ):
        root = Path(tmp)
        lost = await lost_accounts(root, server.url, tenants, sends)
        pages = [await queue_page(root, server.url, n, sends) for n in waiting]
    return {"code": str(Path(gateway.__file__).parent), "lost_accounts": lost, "queue": pages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--waiting", default="10,50,200", help="escalations, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = asyncio.run(measure(args.tenants, [int(n) for n in args.waiting.split(",")]))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    lost = report["lost_accounts"]
    print(f"code: {report['code']}")
    print(
        f"unknown account, {lost['tenants']} tenants served, all lost: "
        f"{lost['tenants_reopened']} tenants' accounts written back, "
        f"{lost['commands']} commands, {lost['round_trips']} round trips"
    )
    for page in report["queue"]:
        print(
            f"queue page, {page['waiting']} waiting ({page['listed']} listed): "
            f"{page['commands']} commands, {page['round_trips']} round trips"
        )


if __name__ == "__main__":
    main()
