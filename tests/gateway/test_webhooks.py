"""Webhooks against a real receiver: an HTTP server in this test process that
refuses the first deliveries with 500 and then takes them. Two gateway processes
serve the tenant on one Redis; one of them is killed mid-delivery. What the
receiver took, deduplicated by event id, is every event once, in journal order,
signed with the tenant's secret, and the same events the admin feed lists: escalated,
approved, rejected, expired, ambiguous and resolved holds."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.state.webhooks import SIGNATURE_HEADER, sign, verify
from irrev.harness import free_port
from ledger.cluster import cluster_enabled
from ledger.embedded import EmbeddedRedis

from .conftest import Gateway, own_gateway, wait_for_workers
from .helpers import effect_headers, order
from .servers import BIN, Server

SECRET_VARIABLE = "ACME_WEBHOOK_SECRET"
BIG = 450  # priced above the orders route's approval threshold: escalates
WAIT_S = 60.0


@dataclass
class Delivery:
    event_id: str
    event_type: str
    attempt: int
    status: int
    signed: bool
    body: dict[str, Any]


@dataclass
class Receiver:
    """Answers 500 to the next `failing` deliveries, then 204; records each one, and
    the most deliveries it ever had in flight at once."""

    secret: bytes
    port: int = field(default_factory=free_port)
    failing: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/irrev"

    def fail_next(self, n: int) -> None:
        with self.lock:
            self.failing = n

    def taken(self) -> list[Delivery]:
        """Deliveries answered 2xx, each event id once (the receiver's deduplication)."""
        with self.lock:
            seen: dict[str, Delivery] = {}
            for delivery in self.deliveries:
                if delivery.status < 300:
                    seen.setdefault(delivery.event_id, delivery)
            return list(seen.values())

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(0.01)  # long enough for two concurrent senders to overlap
        with self.lock:
            self.in_flight -= 1
            status = 500 if self.failing > 0 else 204
            self.failing = max(0, self.failing - 1)
            signature = headers.get(SIGNATURE_HEADER.lower(), "")
            event = json.loads(body)
            self.deliveries.append(
                Delivery(
                    headers.get("irrev-event-id", ""),
                    event["type"],
                    int(headers.get("irrev-delivery-attempt", "0")),
                    status,
                    verify(self.secret, signature, body, time.time()),
                    event,
                )
            )
            assert event["id"] == headers.get("irrev-event-id")
        return status


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    hooks = Receiver(secrets.token_urlsafe(32).encode())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            self.send_response(hooks.handle(headers, body))
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", hooks.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hooks
    server.shutdown()
    server.server_close()


@dataclass
class Pair:
    """Two `irrev serve` processes on one Redis and one policy directory."""

    first: Gateway
    second: Gateway
    redis_url: str


@pytest.fixture(scope="module")
def pair(
    redis_url: str,
    suppliers: Server,
    receiver: Receiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    root: Path = tmp_path_factory.mktemp("webhooks")
    webhook = {"url": receiver.url, "secret": {"env": SECRET_VARIABLE}}
    settings = {
        SECRET_VARIABLE: receiver.secret.decode(),
        "IRREV_WEBHOOK_BACKOFF_S": "0.05",
        "IRREV_WEBHOOK_BACKOFF_MAX_S": "0.4",
        "IRREV_WEBHOOK_TIMEOUT_S": "1",
        "IRREV_WEBHOOK_LEASE_S": "3",
        "IRREV_WEBHOOK_POLL_S": "0.1",
    }
    with own_gateway(redis_url, suppliers, root, 1, {"webhook": webhook}, **settings) as first:
        peer = Server(
            name="peer gateway",
            argv=[str(BIN / "irrev"), "serve"],
            env=first.env,
            log_path=root / "peer.log",
        )
        peer.argv += ["--port", str(peer.port), "--workers", "1"]
        peer.start("/readyz")
        try:
            second = Gateway(peer, redis_url, first.admin_token, first.tenants)
            wait_for_workers(second, workers=1)
            yield Pair(first, second, redis_url)
        finally:
            peer.stop()


async def feed(http: httpx.AsyncClient, gw: Gateway, after: str) -> tuple[list[Any], str]:
    tenant = gw.tenant("own")
    page = await http.get(
        f"{gw.url}/v1/admin/tenants/{tenant.id}/events",
        params={"after": after, "limit": 1000},
        headers=gw.admin,
    )
    assert page.status_code == 200, page.text
    body = page.json()
    return body["events"], body["next"]


async def escalate(http: httpx.AsyncClient, gw: Gateway, agent: str, key: str) -> str:
    response = await http.post(
        f"{gw.url}/tools/supplier/orders",
        json=order(quantity=BIG, supplier_id=key),
        headers=effect_headers(gw.tenant("own"), agent, key),
    )
    assert response.status_code == 202, response.text
    return str(response.json()["escalation"])


async def wait_taken(receiver: Receiver, ids: list[str]) -> list[Delivery]:
    deadline = time.monotonic() + WAIT_S
    while not set(ids) <= {d.event_id for d in receiver.taken()}:
        assert time.monotonic() < deadline, (ids, receiver.deliveries)
        await asyncio.sleep(0.05)
    return [d for d in receiver.taken() if d.event_id in ids]


def record(title: str, deliveries: list[Delivery]) -> None:
    """The run, for the closing note: every attempt, in the order the receiver saw."""
    print(f"\n{title}")
    for d in deliveries:
        hold = d.body.get("hold", "")[:12]
        print(
            f"  {d.event_id:>18}  {d.event_type:<15} hold {hold}  attempt {d.attempt}  -> {d.status}"
        )


async def test_a_receiver_that_fails_then_recovers_gets_each_event_once_in_order_signed(
    pair: Pair, receiver: Receiver
) -> None:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        _, start = await feed(http, pair.first, "-")
        seen_before = len(receiver.deliveries)
        receiver.fail_next(3)
        approved = await escalate(http, pair.first, "buyer-01", "wh-approve")
        rejected = await escalate(http, pair.second, "buyer-02", "wh-reject")
        approve = await http.post(
            f"{pair.second.url}/v1/escalations/{approved}/approve",
            json={"reason": "restock"},
            headers=pair.first.admin,
        )
        assert approve.status_code == 201, approve.text
        reject = await http.post(
            f"{pair.first.url}/v1/escalations/{rejected}/reject",
            json={"reason": "duplicate order"},
            headers=pair.first.admin,
        )
        assert reject.status_code == 200, reject.text
        events, _ = await feed(http, pair.first, start)
        ids = [e["id"] for e in events]
        assert [e["type"] for e in events] == [
            "hold.escalated",
            "hold.escalated",
            "hold.approved",
            "hold.rejected",
        ]
        taken = await wait_taken(receiver, ids)
    run = receiver.deliveries[seen_before:]
    record("receiver fails the first 3 deliveries with 500, then takes them:", run)
    # Once each, in journal order, exactly the feed's events, every one signed.
    assert [d.event_id for d in taken] == ids
    assert [d.body for d in taken] == events
    assert all(d.signed for d in run)
    assert [d.status for d in run[:3]] == [500, 500, 500]
    assert run[3].event_id == ids[0] and run[3].attempt == 4
    # Refused ones were retried, never skipped: nothing after the head was sent early.
    assert [d.event_id for d in run[:4]] == [ids[0]] * 4
    # Two gateway processes, one stream: never two deliveries at once.
    assert receiver.most_in_flight == 1
    assert taken[2].body["reason"] == "restock" and taken[3].body["by"] == "operator:ops"


async def test_expired_ambiguous_and_resolved_holds_are_delivered_too(
    redis_url: str, suppliers: Server, receiver: Receiver, tmp_path: Path
) -> None:
    """The rest of the loop's hold events, through a receiver that refuses the first
    two: an escalation nobody decides (escalation_ttl 1 s), and an order the supplier
    fails with 503 (ambiguous), resolved by hand."""
    webhook = {"url": receiver.url, "secret": {"env": SECRET_VARIABLE}}
    policy = {"webhook": webhook, "escalation_ttl": "1s"}
    settings = {
        SECRET_VARIABLE: receiver.secret.decode(),
        "IRREV_WEBHOOK_BACKOFF_S": "0.05",
        "IRREV_WEBHOOK_BACKOFF_MAX_S": "0.4",
        "IRREV_WEBHOOK_POLL_S": "0.1",
        "IRREV_SWEEP_INTERVAL_S": "0.2",
    }
    with own_gateway(redis_url, suppliers, tmp_path, 1, policy, **settings) as gw:
        tenant = gw.tenant("own")
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            seen_before = len(receiver.deliveries)
            receiver.fail_next(2)
            await escalate(http, gw, "buyer-05", "wh-expire")
            faults = {"status": 503, "apply": False, "times": 1}
            assert (await http.post(f"{tenant.supplier}/_faults", json=faults)).status_code == 200
            failed = await http.post(
                f"{gw.url}/tools/supplier/orders",
                json=order(quantity=30),
                headers=effect_headers(tenant, "buyer-06", "wh-ambiguous"),
            )
            assert failed.status_code == 502, failed.text
            hold = failed.headers["x-irrev-hold"]
            resolved = await http.post(
                f"{gw.url}/v1/admin/tenants/{tenant.id}/holds/{hold}/resolve",
                json={"outcome": "voided", "reason": "no such order at the supplier"},
                headers=gw.admin,
            )
            assert resolved.status_code == 200, resolved.text
            deadline = time.monotonic() + WAIT_S
            while True:
                events, _ = await feed(http, gw, "-")
                if "hold.expired" in {e["type"] for e in events}:
                    break
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.1)
            ids = [e["id"] for e in events]
            taken = await wait_taken(receiver, ids)
    run = receiver.deliveries[seen_before:]
    record("expired, ambiguous and resolved holds, the first 2 deliveries refused:", run)
    assert sorted(e["type"] for e in events) == [
        "hold.ambiguous",
        "hold.escalated",
        "hold.expired",
        "hold.resolved",
    ]
    assert [d.event_id for d in taken] == ids and [d.body for d in taken] == events
    assert all(d.signed for d in run) and [d.status for d in run[:2]] == [500, 500]
    [done] = [d for d in taken if d.event_type == "hold.resolved"]
    assert done.body["reason"] == "no such order at the supplier"


def test_a_wrong_secret_or_a_changed_body_fails_verification() -> None:
    body = b'{"id":"1-0","type":"hold.escalated"}'
    now = int(time.time())
    header = sign(b"right secret", now, body)
    assert verify(b"right secret", header, body, now)
    assert not verify(b"wrong secret", header, body, now)
    assert not verify(b"right secret", header, body + b" ", now)
    assert not verify(b"right secret", header, body, now + 3600)  # a replay, much later
    assert not verify(b"right secret", "t=x,v1=00", body, now)


async def test_the_lease_holder_killed_mid_delivery_the_other_process_delivers(
    pair: Pair, receiver: Receiver
) -> None:
    tenant = pair.first.tenant("own").id
    client = redis.RedisCluster if cluster_enabled(pair.redis_url) else redis.Redis
    store = client.from_url(pair.redis_url, decode_responses=True)
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        _, start = await feed(http, pair.first, "-")
        seen_before = len(receiver.deliveries)
        receiver.fail_next(1_000_000)
        first = await escalate(http, pair.first, "buyer-03", "wh-crash-1")
        deadline = time.monotonic() + WAIT_S
        while len(receiver.deliveries) - seen_before < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        holder = store.get(f"irrev:{{{tenant}}}:webhook:lease")
        assert isinstance(holder, str)  # decode_responses
        pid = int(holder.split(":")[1])
        os.kill(pid, signal.SIGKILL)
        survivor = pair.second if pid in pair.first.worker_pids() else pair.first
        second = await escalate(http, survivor, "buyer-04", "wh-crash-2")
        receiver.fail_next(0)
        events, _ = await feed(http, survivor, start)
        ids = [e["id"] for e in events]
        assert [e["hold"] for e in events] == [
            first.rpartition(".")[2],
            second.rpartition(".")[2],
        ]
        taken = await wait_taken(receiver, ids)
    record(
        "the lease holder SIGKILLed while the receiver fails:", receiver.deliveries[seen_before:]
    )
    assert [d.event_id for d in taken] == ids
    assert store.get(f"irrev:{{{tenant}}}:webhook:lease") != holder


async def test_a_redis_outage_is_logged_once_and_its_end_once(
    redis_server: EmbeddedRedis,
    suppliers: Server,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """Redis killed under a gateway whose dispatcher looks at its tenant every 0.1 s:
    one line says the ledger is unavailable, one says it is back (before, an
    exception with its traceback every poll for the whole outage)."""
    webhook = {"url": receiver.url, "secret": {"env": SECRET_VARIABLE}}
    settings = {SECRET_VARIABLE: receiver.secret.decode(), "IRREV_WEBHOOK_POLL_S": "0.1"}
    policy = {"webhook": webhook}
    with own_gateway(redis_server.url, suppliers, tmp_path, 1, policy, **settings) as gw:

        def dispatcher_lines() -> list[dict[str, Any]]:
            return [e for e in gw.log_entries() if e["msg"].startswith("webhook dispatcher")]

        try:
            redis_server.kill()
            deadline = time.monotonic() + WAIT_S
            while not dispatcher_lines():
                assert time.monotonic() < deadline, gw.server.log()
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)  # some 20 polls of the dispatcher, Redis still down
        finally:
            redis_server.ensure_running()
        deadline = time.monotonic() + WAIT_S
        while not any(e["level"] == "info" for e in dispatcher_lines()):
            assert time.monotonic() < deadline, dispatcher_lines()
            await asyncio.sleep(0.05)
        lines = dispatcher_lines()
    assert [e["level"] for e in lines] == ["warning", "info"], lines
    assert "error" not in lines[0], lines[0]  # no traceback
