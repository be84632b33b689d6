"""A newcomer's three walks through the code (issue 31): which product source files run
code while a gateway serves each one, counted so that a change that spreads a walk over
more files shows.

1. HTTP admit and settle: an agent's order through the proxy, admitted, forwarded to
   the supplier, answered 201 and its hold posted.
2. An MCP call escalated then approved: an agent's `tools/call` (a raw JSON-RPC POST to
   `/mcp`, a keyless host) escalates, an operator approves it, the agent's repeat of
   the call gets the tool's result.
3. A console approval: what gateway/static/console.js does when an operator signs in
   and approves: the page and its assets, the tenants, the tenant's panels (the
   escalation queue and the stress detectors among them), then the approval.

The gateway runs in this process (its lifespan entered as uvicorn would), against a
Redis of its own and real upstream processes (the supplier, the SDK-built MCP tool
server). Its own embedded Redis, not the suite's servers: the counts are the gateway's
files, the same on every server, so the test runs once, in the slow pass (`.ci/run`'s
passes on Redis 7 and the cluster leave it out), on a store no earlier test filled.
A profiler (`sys.setprofile`, and `threading.setprofile` for the threads started after
it, such as `asyncio.to_thread`'s) records the file of every function called while
WALK is set: it is set only for a walk, and the tasks and threads the walk starts
inherit it, while the gateway's background loops (started by the lifespan, before any
walk) do not, so a sweep or a policy refresh during a walk is not counted. Module
bodies (`<module>`: an import during the walk) are not counted either, so the counts do
not depend on what an earlier test imported. Each walk is the first of its kind on a
fresh gateway (the HTTP one counts gateway/settings.py, which only a worker's first
proxied request runs). Not counted: Redis's Lua scripts
(ledger/lua) and the console's static files, which no Python profiler sees.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest
import yaml

import gateway
import ledger
import pricing
from gateway.app import create_app
from gateway.settings import GatewaySettings
from ledger.embedded import EmbeddedRedis
from tests.mcp.conftest import start_tool_server, write_mcp_policy

from .helpers import MCP_PROTOCOL, effect_headers, order
from .servers import EXAMPLES, Server, write_policy

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

# The most gateway files each walk may run code in: the counts measured with the
# pipeline by stage (prepare, reserve, decision, deliver, approve, each under the
# 600/70 bounds of tests/test_sizes.py; the flat layout's were 16, 23 and 19, with
# one 1,067-line admission.py; issue 31 asked for fewer than 25, 30 and 22), so that a
# change that spreads a walk over more files fails here and says so. The MCP walk's 27
# counts gateway/state/mcp_http.py, the pinned tools/call POST of issue 27, apart from
# mcp_upstream.py because together they pass the 600-line bound; its 28th,
# gateway/routes/mcp_results.py, the tool results split from mcp_server.py for the
# same bound when keyless calls learned how they are held (still under issue 31's 30). The
# console walk's 22nd, gateway/state/policy_changes.py, is where a policy's ETag (its
# version's number and digest, StoreVersion) is made for the GET of the policy. Only the
# gateway's are bounded: the libraries' count depends on the server (a Redis Cluster runs one
# ledger file more).
MOST = {"http": 21, "mcp": 28, "console": 22}
TITLES = {
    "http": "HTTP admit and settle",
    "mcp": "MCP call escalated then approved",
    "console": "console approval",
}
# The product's packages: gateway's files are reported apart from the ledger's and
# pricing's.
GATEWAY = Path(gateway.__file__).resolve().parent
LIBRARIES = [Path(ledger.__file__).resolve().parent, Path(pricing.__file__).resolve().parent]
ROOT = GATEWAY.parent
BIG = 450  # 450 x 100 USD: priced above the orders route's 30,000 USD approval threshold
DELETION = "github__delete_repository"  # 5,000 USD fixed, above its 1,000 USD threshold

# The files of the functions called in the current walk (None: no walk).
WALK: ContextVar[set[str] | None] = ContextVar("walk", default=None)


def _profile(frame: FrameType, event: str, arg: object) -> None:
    if event == "call" and (seen := WALK.get()) is not None:
        code = frame.f_code
        if code.co_name != "<module>":
            seen.add(code.co_filename)


@contextlib.contextmanager
def profiling() -> Iterator[None]:
    """The profiler on for this thread and every thread started meanwhile; the previous
    profilers back afterwards."""
    before, before_threads = sys.getprofile(), threading.getprofile()
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    try:
        yield
    finally:
        threading.setprofile(before_threads)
        sys.setprofile(before)


@dataclass(frozen=True)
class Walk:
    name: str
    gateway: list[str]
    libraries: list[str]

    @property
    def count(self) -> int:
        return len(self.gateway) + len(self.libraries)

    def report(self) -> str:
        lines = [
            f"walk {self.name!r} ({TITLES[self.name]}): {self.count} product files "
            f"(gateway {len(self.gateway)}, ledger/pricing {len(self.libraries)})",
            *(f"  {path}" for path in [*self.gateway, *self.libraries]),
        ]
        return "\n".join(lines)


def product_files(seen: set[str], name: str) -> Walk:
    """The product source files among the files `seen`, relative to the repository."""
    paths = {Path(file).resolve() for file in seen if file.endswith(".py")}
    ours = [p for p in paths if p.is_relative_to(GATEWAY)]
    libraries = [p for p in paths if any(p.is_relative_to(lib) for lib in LIBRARIES)]
    return Walk(
        name,
        sorted(str(p.relative_to(ROOT)) for p in ours),
        sorted(str(p.relative_to(ROOT)) for p in libraries),
    )


@asynccontextmanager
async def walking(name: str, walks: dict[str, Walk]) -> AsyncIterator[None]:
    """Records the walk `name` into `walks`: the files seen until the block ends."""
    seen: set[str] = set()
    token = WALK.set(seen)
    try:
        yield
    finally:
        WALK.reset(token)
    walks[name] = product_files(set(seen), name)


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedRedis(tmp_path_factory.mktemp("walks-redis"), tcp=True) as server:
        yield server.url


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("walks-mcp-tools")
    server = start_tool_server(root / "state", root)
    yield server
    server.stop()


def escalating_at_once() -> list[dict[str, Any]]:
    """examples/mcp-fleet.yaml's routes, its calls that escalate answering at once (the
    agent repeats the call for its result) rather than waiting for the decision."""
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "mcp-fleet.yaml").read_text())[
        "routes"
    ]
    return [r if r.get("class") == "read" else {**r, "escalation_wait": "0"} for r in routes]


def mcp_message(name: str, arguments: dict[str, Any]) -> bytes:
    """A raw `tools/call` without an idempotency key (a keyless host; stateless, the
    2026-07-28 protocol)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MCP_PROTOCOL,
        "io.modelcontextprotocol/clientInfo": {"name": "walk", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": name, "arguments": arguments, "_meta": meta}
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    ).encode()


def mcp_headers(token: str, name: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MCP_PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }


def mcp_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC result of a `tools/call`, answered as JSON or as an event stream."""
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        messages = [json.loads(d) for d in data if d.strip()]
        [answer] = [m for m in messages if m.get("id") == 1]
    else:
        answer = response.json()
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


async def test_a_newcomers_three_walks_touch_few_files(
    own_redis: str, suppliers: Server, tool_server: Server, tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    run = uuid.uuid4().hex[:8]
    shop_id = f"walks-{run}"
    shop = write_policy(policies, "procurement", shop_id, f"{suppliers.url}/{shop_id}")
    fleet = write_mcp_policy(
        policies, f"mcp-walks-{run}", tool_server.url, routes=escalating_at_once()
    )
    admin_token = secrets.token_urlsafe(24)
    admin = {"Authorization": f"Bearer {admin_token}"}
    settings = GatewaySettings(
        policy_dir=policies,
        admin_tokens=f"ops={admin_token}",
        upstream_timeout_s=3.0,
        upstream_connect_timeout_s=1.0,
        forward_margin_s=0.5,
        journal_archive_dir=tmp_path / "journal",
    )
    walks: dict[str, Walk] = {}
    with profiling():
        app = create_app(settings, own_redis)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as http,
        ):
            # 1. An order admitted, forwarded, answered 201, its hold posted.
            async with walking("http", walks):
                admitted = await http.post(
                    "/tools/supplier/orders",
                    json=order(quantity=10),
                    headers=effect_headers(shop, "buyer-01", f"walk-{run}"),
                )
            assert admitted.status_code == 201, admitted.text
            assert admitted.headers["x-irrev-decision"] == "admit"
            hold = admitted.headers["x-irrev-hold"]
            posted = await http.get(
                f"/v1/admin/tenants/{shop.id}/holds", params={"state": "posted"}, headers=admin
            )
            assert hold in {h["hold"] for h in posted.json()}, posted.text

            # 2. An MCP call escalated, approved by an operator, repeated for its result.
            target = {"owner": "acme", "repo": f"legacy-{run}"}
            call = mcp_message(DELETION, target)
            headers = mcp_headers(fleet.tokens["dev-01"], DELETION)
            async with walking("mcp", walks):
                first = mcp_result(await http.post("/mcp", content=call, headers=headers))
                assert first["structuredContent"]["status"] == "escalated", first
                escalation = first["structuredContent"]["escalation"]
                approved = await http.post(
                    f"/v1/escalations/{escalation}/approve",
                    headers=fleet.admin_auth,
                    json={"reason": "cleanup ticket OPS-7"},
                )
                assert approved.status_code == 200, approved.text
                done = mcp_result(await http.post("/mcp", content=call, headers=headers))
            assert not done.get("isError"), done
            assert done["structuredContent"]["repo"] == target["repo"], done

            # 3. The console: an order waits for a human; an operator signs in and
            # approves it. The page's calls, in console.js's order (signIn, load,
            # loadDecisions, decideOne); none of them depends on another's answer but
            # the queue's, which holds the escalation.
            waiting = await http.post(
                "/tools/supplier/orders",
                json=order(quantity=BIG),
                headers=effect_headers(shop, "buyer-02", f"console-{run}"),
            )
            assert waiting.status_code == 202, waiting.text
            escalation = waiting.json()["escalation"]
            t = shop.id
            cursor = f"{int(time.time() * 1000) - 3600 * 1000}-0"
            async with walking("console", walks):
                for asset in ("/console", "/console/console.css", "/console/console.js"):
                    assert (await http.get(asset)).status_code == 200, asset
                assert (await http.get("/console/icon.svg")).status_code == 200
                tenants = await http.get("/v1/admin/tenants", headers=admin)
                assert t in {row["tenant"] for row in tenants.json()}, tenants.text
                for path in (
                    f"/v1/admin/tenants/{t}/policy",
                    f"/v1/admin/tenants/{t}/balances",
                    f"/v1/admin/tenants/{t}/holds?state=ambiguous",
                    f"/v1/admin/tenants/{t}/rules",
                    f"/v1/admin/tenants/{t}/refusals?minutes=60",
                    f"/v1/admin/tenants/{t}/keys",
                    f"/v1/admin/tenants/{t}/stress",
                    f"/v1/admin/tenants/{t}/events?after={cursor}&limit=500",
                ):
                    answer = await http.get(path, headers=admin)
                    assert answer.status_code == 200, (path, answer.text)
                queue = await http.get(f"/v1/admin/tenants/{t}/escalations", headers=admin)
                assert escalation in {e["escalation"] for e in queue.json()["escalations"]}
                decided = await http.post(
                    f"/v1/escalations/{escalation}/approve",
                    headers=admin,
                    json={"reason": "budget owner agreed"},
                )
                assert decided.is_success, decided.text

    print()
    for walk in walks.values():
        print(walk.report())
    for name, walk in walks.items():
        assert len(walk.gateway) <= MOST[name], walk.report()
