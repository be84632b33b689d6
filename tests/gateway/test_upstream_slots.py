"""One tenant cannot starve another of upstream connections: every worker sends
upstream through one shared connection pool, and reads are free, so a tenant whose
own upstream hangs could hold every connection of it with reads and another tenant's
effects would wait in the pool until they failed. IRREV_UPSTREAM_TENANT_CONNECTIONS
bounds what one tenant may have in flight upstream per worker."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from gateway.edge.wire import StoredRequest
from gateway.pipeline.upstream import Fate
from gateway.state.http_upstream import HttpTarget, HttpUpstream, UpstreamSlots, make_client

from .conftest import Gateway, wait_for_workers
from .helpers import assert_problem, effect_headers, order
from .servers import BIN, Server, base_env, write_policy

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

POOL = 8  # IRREV_UPSTREAM_MAX_CONNECTIONS, per worker
PER_TENANT = 4  # IRREV_UPSTREAM_TENANT_CONNECTIONS, per worker
WORKERS = 2


@asynccontextmanager
async def hung_upstream() -> AsyncIterator[tuple[str, list[int]]]:
    """An upstream that takes requests and never answers (a stuck API): its URL and
    a one-element count of the connections it was sent."""
    seen = [0]
    held: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen[0] += 1
        held.append(writer)
        await reader.read()  # until the gateway gives up and closes it

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_tenants_hung_upstream_cannot_starve_another_tenants_effects(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    """Tenant "evil" floods free reads at its hung upstream; tenant "acme" orders
    meanwhile. Before, evil's reads held every pooled connection and acme's order
    waited in the pool and was refused (502 upstream_unreachable, PoolTimeout)."""
    async with hung_upstream() as (hung_url, seen):
        policies = tmp_path / "policies"
        policies.mkdir()
        run = secrets.token_hex(4)
        acme_id, evil_id = f"slots-acme-{run}", f"slots-evil-{run}"
        acme = write_policy(policies, "procurement", acme_id, f"{suppliers.url}/{acme_id}")
        evil = write_policy(policies, "procurement", evil_id, hung_url)
        admin = secrets.token_urlsafe(24)
        env = base_env(
            IRREV_REDIS_URL=redis_url,
            IRREV_POLICY_DIR=str(policies),
            IRREV_ADMIN_TOKENS=f"ops={admin}",
            IRREV_UPSTREAM_TIMEOUT_S="6",
            IRREV_UPSTREAM_CONNECT_TIMEOUT_S="1",
            IRREV_FORWARD_MARGIN_S="0.5",
            IRREV_UPSTREAM_MAX_CONNECTIONS=str(POOL),
            IRREV_UPSTREAM_TENANT_CONNECTIONS=str(PER_TENANT),
        )
        server = Server(
            name="slots gateway",
            argv=[str(BIN / "irrev"), "serve"],
            env=env,
            log_path=tmp_path / "gw.log",
        )
        server.argv += ["--port", str(server.port), "--workers", str(WORKERS)]
        server.start("/readyz")
        try:
            wait_for_workers(Gateway(server, redis_url, admin), workers=WORKERS)
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(
                base_url=server.url, timeout=30.0, limits=limits, trust_env=False
            ) as http:
                flood = [
                    asyncio.create_task(
                        http.get("/tools/supplier/catalog", headers=evil.auth("buyer-01"))
                    )
                    for _ in range(4 * POOL * WORKERS)
                ]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 5
                while seen[0] < PER_TENANT * WORKERS and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # the flood is in, waiting upstream
                headers = effect_headers(acme, "buyer-01", "during-the-flood")
                placed = await http.post("/tools/supplier/orders", json=order(), headers=headers)
                assert placed.status_code == 201, placed.text
                answers = await asyncio.gather(*flood)
        finally:
            server.stop()
    refused = [a for a in answers if a.status_code == 502]
    assert refused, "the flood was never bounded"
    assert {a.json()["reason"] for a in refused} <= {"upstream_unreachable", "upstream_ambiguous"}
    for answer in refused:
        assert_problem(answer, 502, answer.json()["reason"])
    assert any(a.json().get("why") == "upstream_tenant_busy" for a in refused)


@pytest.mark.parametrize("slots", [None, 1])
async def test_a_forward_past_its_deadline_is_not_begun(slots: int | None) -> None:
    """A forward whose hold's deadline has passed is not sent, and says why
    (`hold_deadline`): before, with the tenant's slots it read as a busy upstream, and
    without them as an unknown fate (a timeout of zero), which left a request never
    begun ambiguous. The target is a port nothing listens on: a send would be refused."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    limit = None if slots is None else UpstreamSlots(asyncio.Semaphore(slots), 5.0)
    async with make_client(1.0, 1.0, 4) as client:
        upstream = HttpUpstream(client, HttpTarget(f"http://127.0.0.1:{port}"), slots=limit)
        request = StoredRequest(
            agent="a",
            tool="t",
            method="POST",
            path="/orders",
            query="",
            content_type="",
            body_b64="",
            route_id="r",
            price=1,
        )
        answer = await upstream.deliver(request, "h1", time.monotonic() - 0.001)
    assert (answer.fate, answer.why) == (Fate.NOT_SENT, "hold_deadline")
