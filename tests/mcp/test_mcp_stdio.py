"""stdio MCP servers (`tools.<name>.mcp_command`) behind `irrev serve --workers 2` on
real Redis: each worker runs its own process of the SDK-built tool server's stdio
entry (irrev/upstreams/mcp_tools_stdio.py), which records every start, call and
effect in files. Priced, held, escalated and settled as the HTTP ones are; a process
SIGKILLed mid-call leaves the hold ambiguous and charged and is started again; a
command that cannot start, or that keeps exiting, is refused with its reason and
releases the hold; a changed command replaces the process; stopping the gateway (or
killing a worker) leaves no process behind."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from irrev.harness import PolicyDraft
from tests.gateway.conftest import Gateway
from tests.gateway.helpers import balances, used
from tests.gateway.servers import BIN

from .conftest import McpTenant, agent, key, order, serve, structured, write_mcp_policy

# A gateway and stdio servers of the module's own (~35 s): .ci/run's slow pass runs it.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]

TOKEN = secrets.token_urlsafe(16)
# Small bounds, so that a server that keeps exiting is given up on within a second.
SETTINGS = {
    "IRREV_UPSTREAM_TIMEOUT_S": "10",
    "IRREV_MCP_RESTARTS": "2",
    "IRREV_POLICY_CHECK_INTERVAL_S": "0.5",
    "IRREV_MCP_RESTART_BACKOFF_S": "0.05",
    "STDIO_TOOL_TOKEN": TOKEN,  # the gateway's own secret, given to its servers
}
WAIT_S = 20.0


def server_command(namespace: str, *extra: str) -> list[str]:
    """The stdio entry serving `namespace`; it ignores `extra`, which its start record
    shows (which server a process is, which version of the command)."""
    return [str(BIN / "python"), "-m", "irrev.upstreams.mcp_tools_stdio", namespace, *extra]


def stdio_tools(state: Path, namespace: str, command: list[str] | None = None) -> dict[str, Any]:
    """The example's two MCP servers as stdio processes of the tool server's stdio
    entry, both serving `namespace`, with the gateway's secret in their environment."""

    def server(name: str) -> dict[str, Any]:  # one each: YAML writes a shared one as an alias
        return {
            "mcp_command": command or server_command(namespace, name),
            "mcp_env": {
                "MCP_TOOL_STATE": str(state),
                "MCP_TOOL_TOKEN": {"env": "STDIO_TOOL_TOKEN"},
            },
            "mcp_cwd": str(state),
        }

    return {"procure": server("procure"), "github": server("github")}


@dataclass
class Records:
    """What the stdio tool server's processes of one namespace wrote."""

    state: Path
    namespace: str

    def _lines(self, suffix: str) -> list[dict[str, Any]]:
        path = self.state / f"{self.namespace}{suffix}"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def starts(self) -> list[dict[str, Any]]:
        return self._lines(".starts.jsonl")

    def calls(self, key: str) -> list[dict[str, Any]]:
        return [call for call in self._lines(".calls.jsonl") if call["key"] == key]

    def calls_of(self, tool: str) -> list[dict[str, Any]]:
        return [call for call in self._lines(".calls.jsonl") if call["tool"] == tool]

    def effects(self, key: str) -> int:
        """Effects made under `key` (every line is one, whichever process made it)."""
        return sum(1 for effect in self._lines(".jsonl") if effect["key"] == key)

    def set_faults(self, faults: dict[str, Any]) -> None:
        (self.state / f"{self.namespace}.faults.json").write_text(json.dumps(faults))


@dataclass
class StdioGateway:
    gateway: Gateway
    state: Path
    tenants: dict[str, McpTenant]

    @property
    def url(self) -> str:
        return self.gateway.url

    def tenant(self, name: str) -> McpTenant:
        return self.tenants[name]

    def records(self, name: str) -> Records:
        return Records(self.state, self.tenants[name].namespace)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its worker) is gone for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def until(condition: Any, what: str, within_s: float = WAIT_S) -> Any:
    """Poll `condition()` until it is truthy (returned) or the deadline passes."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not (found := condition()):
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)
    return found


def write_stdio_tenants(policies: Path, state: Path, run: str) -> dict[str, McpTenant]:
    tenants = {}
    for name in ("stdio", "crash", "reload"):
        tenant_id = f"stdio-{name}-{run}"
        tenants[name] = write_mcp_policy(
            policies, tenant_id, "", tools=stdio_tools(state, tenant_id)
        )
    broken = f"stdio-broken-{run}"
    tenants["broken"] = write_mcp_policy(
        policies, broken, "", tools=stdio_tools(state, broken, ["/nonexistent/mcp-server"])
    )
    crashing = f"stdio-crashing-{run}"
    exits = [str(BIN / "python"), "-c", "raise SystemExit(3)"]
    tenants["crashing"] = write_mcp_policy(
        policies, crashing, "", tools=stdio_tools(state, crashing, exits)
    )
    return tenants


@pytest.fixture(scope="module")
def stdio_gateway(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StdioGateway]:
    root = tmp_path_factory.mktemp("stdio-gateway")
    policies, state = root / "policies", root / "state"
    policies.mkdir()
    state.mkdir()
    tenants = write_stdio_tenants(policies, state, uuid.uuid4().hex[:8])
    gateway = serve(root, redis_url, policies, **SETTINGS)
    yield StdioGateway(gateway, state, tenants)
    gateway.server.stop()


@pytest.fixture
async def http(stdio_gateway: StdioGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stdio_gateway.url, timeout=30.0, trust_env=False) as c:
        yield c


async def hold_state(
    http: httpx.AsyncClient, gw: StdioGateway, tenant: McpTenant, hold: str
) -> str:
    response = await http.get(
        f"/v1/holds/{hold}", params={"tenant": tenant.id}, headers=gw.gateway.admin
    )
    assert response.status_code == 200, response.text
    state: str = response.json()["state"]
    return state


async def test_a_stdio_server_is_listed_called_once_and_posted(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    tenant = stdio_gateway.tenant("stdio")
    records = stdio_gateway.records("stdio")
    meta = key()
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        first = await client.call_tool("procure__place_order", order(), meta=meta)
        again = await client.call_tool("procure__place_order", order(), meta=meta)
        read = await client.call_tool("procure__get_order", {"order_id": "o-1"})
    assert "procure__place_order" in listed and "github__delete_repository" in listed
    assert not first.is_error, first
    assert first.meta is not None
    hold = first.meta["dev.irrev/hold"]
    assert again.structured_content == first.structured_content
    assert records.effects(f"irrev-{hold}") == 1
    assert len(records.calls(f"irrev-{hold}")) == 1
    assert await hold_state(http, stdio_gateway, tenant, hold) == "posted"
    assert not read.is_error and read.structured_content == {"order_id": "o-1", "status": "open"}


async def test_the_process_gets_the_gateways_secret_and_nothing_else_of_its_environment(
    stdio_gateway: StdioGateway,
) -> None:
    tenant = stdio_gateway.tenant("stdio")
    async with agent(stdio_gateway.url, tenant.auth("buyer-02")) as client:
        await client.call_tool("procure__get_order", {"order_id": "o-2"})
    start = stdio_gateway.records("stdio").starts()[0]
    assert start["token_sha256"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert start["cwd"] == str(stdio_gateway.state)
    # Not the gateway's settings (its admin tokens, its Redis), not the secret's source.
    assert not [name for name in start["env"] if name.startswith("IRREV_")]
    assert "STDIO_TOOL_TOKEN" not in start["env"]


async def test_deny_and_is_error_are_decided_as_for_http_servers(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    tenant = stdio_gateway.tenant("stdio")
    before = used(await balances(http, stdio_gateway.gateway.admin, tenant))
    async with agent(stdio_gateway.url, tenant.auth("buyer-02")) as client:
        capped = await client.call_tool(
            "procure__place_order", order(quantity=700), meta=key(capped_key := uuid.uuid4().hex)
        )
        rejected = await client.call_tool("procure__reject_order", order(), meta=key())
        flaky = await client.call_tool("procure__flaky_order", order(), meta=key())
    assert structured(capped)["reason"] == "per_effect_cap"
    assert not stdio_gateway.records("stdio").calls(capped_key)
    states = {}
    for name, result in (("rejected", rejected), ("flaky", flaky)):
        assert result.is_error and result.meta is not None
        states[name] = await hold_state(http, stdio_gateway, tenant, result.meta["dev.irrev/hold"])
    assert states == {"rejected": "voided", "flaky": "ambiguous"}
    after = used(await balances(http, stdio_gateway.gateway.admin, tenant))
    # Only the flaky order stays charged.
    assert sum(after.values()) > sum(before.values())


async def test_an_approved_escalation_makes_one_call_and_the_queue_names_server_and_tool(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    """A keyless call (a host's) waits for the decision (the route's default
    escalation_wait); the approver reads which server's tool it is, and of four
    approvals one wins."""
    tenant = stdio_gateway.tenant("stdio")
    deletion = {"owner": "acme", "repo": f"legacy-{uuid.uuid4().hex[:6]}"}

    async def queued() -> list[dict[str, Any]]:
        queue = await http.get(
            f"/v1/admin/tenants/{tenant.id}/escalations", headers=tenant.admin_auth
        )
        return [e for e in queue.json()["escalations"] if e["agent"] == "dev-01"]

    async with agent(stdio_gateway.url, tenant.auth("dev-01")) as client:
        call = asyncio.create_task(client.call_tool("github__delete_repository", deletion))
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not (items := await queued()):
            assert asyncio.get_running_loop().time() < deadline, "never escalated"
            await asyncio.sleep(0.05)
        (item,) = items
        assert item["target"] == "CALL github/delete_repository"
        approvals = [
            http.post(f"/v1/escalations/{item['escalation']}/approve", headers=tenant.admin_auth)
            for _ in range(4)
        ]
        statuses = sorted(r.status_code for r in await asyncio.gather(*approvals))
        done = await call
    assert statuses == [200, 409, 409, 409]
    assert not done.is_error, done
    assert done.meta is not None
    upstream_key = f"irrev-{done.meta['dev.irrev/hold']}"
    records = stdio_gateway.records("stdio")
    assert records.effects(upstream_key) == 1 and len(records.calls(upstream_key)) == 1


async def test_a_process_killed_mid_call_leaves_it_charged_and_is_started_again(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    tenant = stdio_gateway.tenant("crash")
    records = stdio_gateway.records("crash")
    records.set_faults({"delay_s": 60})  # the call waits inside the server
    meta = key()
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        call = asyncio.create_task(client.call_tool("procure__place_order", order(), meta=meta))
        (received,) = await until(
            lambda: records.calls_of("place_order"), "the server received the call"
        )
        killed = received["pid"]
        os.kill(killed, signal.SIGKILL)
        result = await call
    assert result.is_error
    assert structured(result)["reason"] == "upstream_ambiguous"
    assert structured(result)["why"] == "process_exited"
    hold = structured(result)["hold"]
    assert await hold_state(http, stdio_gateway, tenant, hold) == "ambiguous"
    assert used(await balances(http, stdio_gateway.gateway.admin, tenant))  # still charged

    records.set_faults({})
    worker = next(s["ppid"] for s in records.starts() if s["pid"] == killed)
    await until(
        lambda: [s for s in records.starts() if s["ppid"] == worker and s["pid"] != killed],
        "the worker started its server again",
    )
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        after = await client.call_tool("procure__place_order", order(quantity=2), meta=key())
    assert not after.is_error, after


async def test_a_command_that_cannot_start_is_refused_and_releases_the_hold(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    tenant = stdio_gateway.tenant("broken")
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        result = await client.call_tool("procure__place_order", order(), meta=key())
    assert result.is_error
    refusal = result.structured_content
    assert refusal["reason"] == "upstream_unreachable"
    assert refusal["why"] in ("process_not_started", "process_restart_limit")
    assert await hold_state(http, stdio_gateway, tenant, refusal["hold"]) == "voided"
    assert not used(await balances(http, stdio_gateway.gateway.admin, tenant))
    logged = [
        e for e in stdio_gateway.gateway.log_entries() if e.get("server", "").startswith(tenant.id)
    ]
    assert any("No such file or directory" in e.get("error", "") for e in logged)


async def test_a_server_that_keeps_exiting_is_given_up_on_with_a_clear_refusal(
    stdio_gateway: StdioGateway, http: httpx.AsyncClient
) -> None:
    tenant = stdio_gateway.tenant("crashing")
    whys: list[str] = []

    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:

        async def given_up() -> bool:
            result = await client.call_tool("procure__place_order", order(), meta=key())
            assert structured(result)["reason"] == "upstream_unreachable"
            whys.append(structured(result)["why"])
            return whys[-1] == "process_restart_limit"

        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not await given_up():
            assert asyncio.get_running_loop().time() < deadline, whys
    assert set(whys) <= {"process_not_started", "process_restarting", "process_restart_limit"}
    assert not used(await balances(http, stdio_gateway.gateway.admin, tenant))
    down = [e for e in stdio_gateway.gateway.log_entries() if e.get("msg") == "MCP server down"]
    assert any(tenant.id in e["server"] and "restarts within" in e["why"] for e in down)


async def test_a_changed_command_replaces_the_process(stdio_gateway: StdioGateway) -> None:
    tenant = stdio_gateway.tenant("reload")
    records = stdio_gateway.records("reload")
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        await client.call_tool("procure__get_order", {"order_id": "o-1"})
    old = [s["pid"] for s in records.starts() if s["argv"][1:] == ["procure"]]
    github = [s["pid"] for s in records.starts() if s["argv"][1:] == ["github"] and alive(s["pid"])]
    assert old
    policies = stdio_gateway.gateway.policy_dir
    policy = PolicyDraft(yaml.safe_load((policies / f"{tenant.id}.yaml").read_text()))
    changed = server_command(tenant.namespace, "procure", "v2")
    policy.document["tools"]["procure"]["mcp_command"] = changed
    policy.write(policies)
    await until(lambda: not any(alive(pid) for pid in old), "the old processes stopped")
    async with agent(stdio_gateway.url, tenant.auth("buyer-01")) as client:
        result = await client.call_tool("procure__get_order", {"order_id": "o-2"})
    assert not result.is_error, result
    assert [s for s in records.starts() if s["argv"][1:] == ["procure", "v2"]]
    assert all(alive(pid) for pid in github)  # unchanged: kept running


async def test_a_killed_workers_server_exits_with_it(stdio_gateway: StdioGateway) -> None:
    """Its processes run in sessions of their own (a signal to the gateway's process
    group does not reach them): they read the end of their input and exit."""
    tenant = stdio_gateway.tenant("reload")
    records = stdio_gateway.records("reload")
    workers = stdio_gateway.gateway.worker_pids()
    async with agent(stdio_gateway.url, tenant.auth("buyer-02")) as client:
        result = await client.call_tool("procure__get_order", {"order_id": "o-3"})
    assert not result.is_error, result
    child = next(s for s in records.starts() if s["ppid"] in workers and alive(s["pid"]))
    os.kill(child["ppid"], signal.SIGKILL)
    await until(lambda: not alive(child["pid"]), "the dead worker's server exited")


@pytest.mark.slow
async def test_stopping_the_gateway_stops_every_server_process(
    redis_url: str, tmp_path: Path
) -> None:
    """Each worker stops its processes as it stops (the SDK's shutdown: stdin closed,
    then SIGTERM, then SIGKILL), before the gateway exits."""
    policies, state = tmp_path / "policies", tmp_path / "state"
    policies.mkdir()
    state.mkdir()
    tenant_id = f"stdio-stop-{uuid.uuid4().hex[:8]}"
    tenant = write_mcp_policy(policies, tenant_id, "", tools=stdio_tools(state, tenant_id))
    records = Records(state, tenant_id)
    gateway = serve(tmp_path, redis_url, policies, **SETTINGS)
    try:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        # Each session is a new connection, which either worker may take: until both
        # run a server (or the deadline; one is enough to test).
        while len({s["ppid"] for s in records.starts()}) < 2:
            async with agent(gateway.url, tenant.auth("buyer-01")) as client:
                result = await client.call_tool("procure__get_order", {"order_id": "o-1"})
            assert not result.is_error, result
            if asyncio.get_running_loop().time() > deadline:
                break
    finally:
        gateway.server.stop()
    started = [s["pid"] for s in records.starts()]
    assert started
    assert not [pid for pid in started if alive(pid)], "server processes outlived the gateway"
