"""What an agent's escalations cost the gateway's other callers, on a real gateway and
Redis: the approval queue comes in pages without request bodies (the body is read
from the hold), and a /metrics scrape without a token reads no hold at all, however
many wait; with IRREV_METRICS_TENANT_LABELS (whose gauges need every waiting hold)
anyone's scrapes share one read per IRREV_METRICS_CACHE_S."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from irrev.harness import PolicyDraft
from ledger import EmbeddedRedis, Ledger
from pricing.units import rfc3339

from .conftest import Gateway, own_gateway
from .helpers import assert_problem, effect_headers, order
from .servers import EXAMPLES, Server

WAITING = 30
SKU = "long-description-" + "x" * 4000  # a body of some size, kept with each hold


def cheap_escalations() -> list[dict[str, Any]]:
    """The example's routes with the orders route's approval threshold at 0.01 USD:
    every order escalates, however cheap."""
    routes: list[dict[str, Any]] = PolicyDraft.read(EXAMPLES / "procurement.yaml").document[
        "routes"
    ]
    for route in routes:
        if route["tool"] == "supplier" and route["route"] == "POST /orders":
            route["approval_threshold"] = "0.01"
    return routes


@contextmanager
def waiting_gateway(
    redis_url: str, suppliers: Server, root: Path, **settings: str
) -> Iterator[Gateway]:
    """A gateway of its own (one worker) whose tenant has WAITING escalations."""
    # One agent keeps all of them waiting: more than the default max_escalations.
    policy = {"routes": cheap_escalations(), "max_escalations": WAITING}
    with own_gateway(redis_url, suppliers, root, 1, policy, **settings) as gw:
        with httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as http:
            for i in range(WAITING):
                response = http.post(
                    "/tools/supplier/orders",
                    json=order(quantity=1, unit_price="10", sku=f"{SKU}-{i}"),
                    headers=effect_headers(gw.tenant("own"), "buyer-01", f"cheap-{i}"),
                )
                assert response.status_code == 202, response.text
        yield gw


@contextmanager
def quiet_redis(root: Path) -> Iterator[str]:
    """A Redis of one gateway's own: hold reads are counted by INFO commandstats,
    which every other gateway on the session's servers adds to (a CI run counted 415
    reads for five scrapes that made none)."""
    with EmbeddedRedis(root / "redis", tcp=True) as server:
        yield server.url


@pytest.fixture(scope="module")
def queue_gateway(suppliers: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("queue")
    with quiet_redis(root) as url, waiting_gateway(url, suppliers, root) as gw:
        yield gw


class HoldReads:
    """HGET and HMGET calls on the Redis of `url` (a standalone server), so far."""

    def __init__(self, url: str) -> None:
        self.store = redis.Redis.from_url(url)

    def __call__(self) -> int:
        stats = self.store.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("hmget", "hget"))


@pytest.fixture
async def client(queue_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=queue_gateway.url, timeout=30, trust_env=False) as c:
        yield c


async def test_the_queue_pages_oldest_first_without_bodies(
    queue_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """Before: one list of every escalation, each with its request body (2,000 of
    them made a 1.66 MB answer; 100 of 500 KB, 50 MiB), and no way to ask for less."""
    gw = queue_gateway
    url = f"/v1/admin/tenants/{gw.tenant('own').id}/escalations"
    seen: list[dict[str, Any]] = []
    after: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 7} | ({"after": after} if after else {})
        page = await client.get(url, params=params, headers=gw.admin)
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["total"] == WAITING and len(body["escalations"]) <= 7
        seen += body["escalations"]
        pages += 1
        after = body["next"]
        if after is None:
            break
    assert pages == 5  # 7 + 7 + 7 + 7 + 2
    assert len({item["escalation"] for item in seen}) == WAITING
    assert all("body" not in item for item in seen)
    created = [item["created_at"] for item in seen]
    assert created == sorted(created)
    # The body is one GET away, for the one escalation a person looks at.
    hold = await client.get(
        f"/v1/admin/tenants/{gw.tenant('own').id}/holds/{seen[0]['hold']}", headers=gw.admin
    )
    assert SKU in hold.json()["body"]
    for bad in ("x", "1-", "-abc", "١٢-abc", "1-a b"):
        answer = await client.get(url, params={"after": bad}, headers=gw.admin)
        assert_problem(answer, 422, "bad_request")
    too_many = await client.get(url, params={"limit": 1000}, headers=gw.admin)
    assert_problem(too_many, 422, "bad_request")


async def test_a_page_lists_the_waiting_holds_as_each_reads_alone(
    queue_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """Issue 31: a page's holds are one batch read (Ledger.holds), not a round trip
    each; the queue and the listing of escalated holds show the same holds, in the
    same order and with the same times, as reading each hold alone does."""
    gw = queue_gateway
    tenant = gw.tenant("own").id
    ledger = Ledger.from_url(gw.redis_url)
    try:
        ids = [hold_id for _, hold_id in await ledger.escalation_order(tenant)]
        alone = [await ledger.hold(tenant, hold_id) for hold_id in ids]
    finally:
        await ledger.aclose()
    assert len(ids) == WAITING and all(h is not None for h in alone)
    page = await client.get(
        f"/v1/admin/tenants/{tenant}/escalations", params={"limit": 200}, headers=gw.admin
    )
    assert page.status_code == 200, page.text
    items = page.json()["escalations"]
    assert [(i["hold"], i["created_at"], i["deadline_at"]) for i in items] == [
        (h.hold_id, rfc3339(h.created_ms), rfc3339(h.deadline_ms)) for h in alone if h
    ]
    assert all(i["reason"] == "approval_threshold" for i in items)
    listed = await client.get(
        f"/v1/admin/tenants/{tenant}/holds", params={"state": "escalated"}, headers=gw.admin
    )
    assert listed.status_code == 200, listed.text
    assert [h["hold"] for h in listed.json()] == sorted(ids)


async def test_a_scrape_without_a_token_reads_no_hold(
    queue_gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """Before: each anonymous scrape read every escalated and ambiguous hold (2,125
    Redis commands for one scrape in the hostile review)."""
    reads = HoldReads(queue_gateway.redis_url)
    scrapes = 5
    before = reads()
    for _ in range(scrapes):
        scrape = await client.get("/metrics")
        assert scrape.status_code == 200
        assert 'irrev_live_holds{state="escalated"} 30.0' in scrape.text
    anonymous = reads() - before
    before = reads()
    operator = await client.get("/metrics", headers=queue_gateway.admin)
    detailed = reads() - before
    reads.store.close()
    print(f"\nhold reads: {scrapes} anonymous scrapes {anonymous}, an operator's {detailed}")
    # An operator's scrape shows the queue's ages: it reads each waiting hold.
    assert "irrev_escalation_oldest_age_seconds" in operator.text
    assert detailed >= WAITING
    # Anyone's shows counts only and reads none (a sweep running meanwhile may read a
    # few: far fewer than one per hold per scrape).
    assert anonymous < WAITING, anonymous


async def test_with_tenant_labels_for_anyone_their_scrapes_share_one_read(
    suppliers: Server, tmp_path: Path
) -> None:
    """IRREV_METRICS_TENANT_LABELS shows anyone the queue's ages, which read every
    waiting hold: anyone's scrapes reuse one read (here for 5 minutes); an operator's
    always reads. Before: every anonymous scrape read every hold."""
    settings = {"IRREV_METRICS_TENANT_LABELS": "true", "IRREV_METRICS_CACHE_S": "300"}
    with (
        quiet_redis(tmp_path) as url,
        waiting_gateway(url, suppliers, tmp_path, **settings) as gw,
    ):
        reads = HoldReads(url)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, trust_env=False) as http:
            before = reads()
            first = await http.get("/metrics")
            filled = reads() - before
            before = reads()
            for _ in range(5):
                again = await http.get("/metrics")
                assert "irrev_escalation_oldest_age_seconds{" in again.text
            shared = reads() - before
            before = reads()
            await http.get("/metrics", headers=gw.admin)
            operator = reads() - before
    reads.store.close()
    print(f"\nhold reads: the first scrape {filled}, 5 more {shared}, an operator's {operator}")
    assert 'irrev_live_holds{state="escalated",tenant="' in first.text
    assert filled >= WAITING and operator >= WAITING
    assert shared < WAITING, shared
