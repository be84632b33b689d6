"""Webhooks against hostile receivers: a receiver process (tests/gateway/
hook_receiver.py) that answers 200 and then floods its answer (hundreds of MiB) or
trickles it (a byte at a time for longer than the dispatcher's lease), served by
`irrev serve --workers 2` on a real Redis.

The dispatcher reads only the first few KB of an answer (its status is all that
counts) and gives each attempt a deadline shorter than its lease: a trickling
receiver's delivery fails and is retried, in order, and never overlaps a second
dispatcher's delivery of the same event."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Gateway, own_gateway
from .helpers import effect_headers, order
from .servers import BIN, Server, base_env

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

SECRET_VARIABLE = "ACME_WEBHOOK_SECRET"
BIG = 450  # priced above the orders route's approval threshold: escalates
WAIT_S = 60.0
FLOOD_BYTES = 256 << 20
# What may sit in the two sockets' kernel buffers (tcp_rmem/tcp_wmem maxima) when
# the gateway hangs up: far below the flood, far above what the gateway reads.
BUFFERED_BYTES = 64 << 20


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Server]:
    server = Server(
        name="hook receiver",
        argv=[str(BIN / "python"), "-m", "tests.gateway.hook_receiver"],
        env=base_env(),
        log_path=tmp_path / "receiver.log",
    )
    server.argv.append(str(server.port))
    server.start("/ready")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hooks_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """Two workers (two dispatchers that may deliver), for the module's tests."""
    settings = {
        SECRET_VARIABLE: secrets.token_urlsafe(32),
        "IRREV_WEBHOOK_BACKOFF_S": "0.2",
        "IRREV_WEBHOOK_BACKOFF_MAX_S": "0.4",
        "IRREV_WEBHOOK_TIMEOUT_S": "1",
        "IRREV_WEBHOOK_LEASE_S": "3",
        "IRREV_WEBHOOK_POLL_S": "0.1",
    }
    root = tmp_path_factory.mktemp("hooks")
    with own_gateway(redis_url, suppliers, root, 2, None, **settings) as gw:
        yield gw


@pytest.fixture
def gateway(hooks_gateway: Gateway, receiver: Server) -> Gateway:
    """The module's gateway, with a tenant of the test's own (`.tenant("hooked")`)
    whose events go to the test's receiver."""
    webhook = {"url": f"{receiver.url}/hooks", "secret": {"env": SECRET_VARIABLE}}
    tenant = hooks_gateway.new_tenant("hooked", webhook=webhook)
    return replace(hooks_gateway, tenants={"hooked": tenant})


async def escalate(http: httpx.AsyncClient, gw: Gateway, agent: str, key: str) -> None:
    response = await http.post(
        f"{gw.url}/tools/supplier/orders",
        json=order(quantity=BIG, supplier_id=key),
        headers=effect_headers(gw.tenant("hooked"), agent, key),
    )
    assert response.status_code == 202, response.text


async def event_ids(http: httpx.AsyncClient, gw: Gateway) -> list[str]:
    tenant = gw.tenant("hooked").id
    page = await http.get(
        f"{gw.url}/v1/admin/tenants/{tenant}/events", params={"limit": 1000}, headers=gw.admin
    )
    assert page.status_code == 200, page.text
    return [e["id"] for e in page.json()["events"]]


async def deliveries(http: httpx.AsyncClient, receiver: Server) -> dict[str, Any]:
    answer = await http.get(f"{receiver.url}/deliveries")
    assert answer.status_code == 200
    return dict(answer.json())


async def wait_taken(http: httpx.AsyncClient, receiver: Server, ids: list[str]) -> dict[str, Any]:
    """The receiver's record once it answered every one of `ids` with 204 and no
    delivery is in its hands any more."""
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = await deliveries(http, receiver)
        taken = {d["id"] for d in seen["deliveries"] if d["mode"] == "take" and d["done"]}
        if set(ids) <= taken and all(d["done"] for d in seen["deliveries"]):
            return seen
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.1)


async def test_a_flooding_answer_is_cut_off_after_a_few_kilobytes(
    gateway: Gateway, receiver: Server
) -> None:
    """Before: the whole 256 MiB answer was read into the worker (the receiver wrote
    every byte of it)."""
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        mode = {"mode": "flood", "times": 1, "bytes": FLOOD_BYTES}
        assert (await http.post(f"{receiver.url}/mode", json=mode)).status_code == 200
        await escalate(http, gateway, "buyer-01", "flood-1")
        await escalate(http, gateway, "buyer-02", "flood-2")
        ids = await event_ids(http, gateway)
        assert len(ids) == 2
        seen = await wait_taken(http, receiver, ids[1:])
    flood, *rest = seen["deliveries"]
    # The gateway hung up: what the receiver got into the sockets is bounded by their
    # buffers, not by the answer.
    assert flood["mode"] == "flood" and not flood["complete"], flood
    assert flood["written"] < BUFFERED_BYTES, flood
    # A 200 is a 200: the flooded event counts as delivered, the next one follows once.
    assert flood["id"] == ids[0]
    assert [(d["id"], d["attempt"], d["mode"]) for d in rest] == [(ids[1], 1, "take")]


async def test_a_trickling_receiver_fails_its_attempts_and_no_delivery_overlaps(
    gateway: Gateway, receiver: Server
) -> None:
    """A byte every 0.5 s for 6 s: twice the 3 s lease. Before: the attempt went on
    past the lease, the other worker took the lease and sent the same event while the
    first delivery was still open (two in flight), each trickled answer was read to
    its end and the event was taken more than once."""
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        mode = {"mode": "trickle", "times": 2, "every_s": 0.5, "count": 12}
        assert (await http.post(f"{receiver.url}/mode", json=mode)).status_code == 200
        await escalate(http, gateway, "buyer-01", "trickle-1")
        await escalate(http, gateway, "buyer-02", "trickle-2")
        ids = await event_ids(http, gateway)
        assert len(ids) == 2
        seen = await wait_taken(http, receiver, ids)
    run = [(d["id"], d["attempt"], d["mode"], d["complete"]) for d in seen["deliveries"]]
    # The first event's two trickled attempts ran out of time (the gateway hung up),
    # its third was taken, and only then the second event: in order, once each.
    assert run == [
        (ids[0], 1, "trickle", False),
        (ids[0], 2, "trickle", False),
        (ids[0], 3, "take", True),
        (ids[1], 1, "take", True),
    ]
    assert seen["most_in_flight"] == 1
