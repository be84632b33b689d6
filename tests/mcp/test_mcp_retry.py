"""A repeat of an ambiguous call to a server that deduplicates (`dedupes: true`) is
sent again; a repeat that cannot reach the server, or that it refuses, proves nothing
about the first call, so the hold stays ambiguous and charged. Derived keys tell
JSON-RPC ids 1 and "1" apart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from mcp.types import RequestParamsMeta

from tests.conftest import ReplicatedRedis
from tests.gateway.conftest import Gateway
from tests.gateway.helpers import balances, used
from tests.gateway.servers import Server

from .conftest import (
    KEY_META,
    McpGateway,
    McpTenant,
    agent,
    key,
    order,
    serve,
    start_tool_server,
    structured,
    tool_stats,
    write_mcp_policy,
)

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]
MODERN = "2026-07-28"


@dataclass
class Ambiguous:
    """A gateway whose tool server (it deduplicates) answered the first call past the
    gateway's wait, the call's derived key and hold, and a client of the tool server's
    own endpoints."""

    gateway: Gateway
    tools: Server
    tools_http: httpx.AsyncClient
    tenant: McpTenant
    meta: RequestParamsMeta
    hold: str


@asynccontextmanager
async def ambiguous_call(
    tmp_path: Path, redis_url: str, name: str, **settings: str
) -> AsyncIterator[Ambiguous]:
    """A first call left ambiguous (the server delays it past the gateway's 1 s wait),
    once the server has made its effect."""
    tools = start_tool_server(tmp_path / "state", tmp_path)
    policies = tmp_path / "policies"
    policies.mkdir()
    tenant = write_mcp_policy(
        policies,
        f"{name}-{uuid.uuid4().hex[:8]}",
        tools.url,
        tools={"procure": {"mcp": "", "dedupes": True}, "github": {"mcp": ""}},
    )
    gateway = serve(tmp_path, redis_url, policies, IRREV_UPSTREAM_TIMEOUT_S="1", **settings)
    try:
        async with httpx.AsyncClient(base_url=tools.url, trust_env=False) as own:
            await own.post(f"/{tenant.namespace}/_faults", json={"delay_s": 2})
            meta = key()
            async with agent(gateway.url, tenant.auth("buyer-01")) as client:
                first = await client.call_tool("procure__place_order", order(), meta=meta)
            assert structured(first)["reason"] == "upstream_ambiguous", first
            deadline = time.monotonic() + 20
            while (await tool_stats(own, tenant))["effects"] == 0:
                assert time.monotonic() < deadline, "the first call never took effect"
                await asyncio.sleep(0.05)
            yield Ambiguous(gateway, tools, own, tenant, meta, structured(first)["hold"])
    finally:
        gateway.server.stop()
        tools.kill()


async def test_a_repeat_the_server_is_down_for_keeps_the_call_ambiguous(
    redis_url: str, tmp_path: Path
) -> None:
    """The first call took effect but outlived the gateway's wait (ambiguous); the
    server then went down and the repeat could not reach it. Before, the repeat voided
    the hold ("nothing was sent and the hold was released"): an effect made, uncharged."""
    async with ambiguous_call(tmp_path, redis_url, "mcp-redo") as call:
        call.tools.kill()
        tenant, admin = call.tenant, call.gateway.admin
        async with httpx.AsyncClient(base_url=call.gateway.url, trust_env=False) as gw:
            charged = used(await balances(gw, admin, tenant))
            async with agent(call.gateway.url, tenant.auth("buyer-01")) as client:
                again = await client.call_tool("procure__place_order", order(), meta=call.meta)
            assert again.is_error
            assert structured(again)["reason"] == "upstream_ambiguous", again
            assert "Do not make it as a new call" in structured(again)["detail"]
            base = f"/v1/admin/tenants/{tenant.id}"
            listed = await gw.get(f"{base}/holds?state=ambiguous", headers=admin)
            assert [h["hold"] for h in listed.json()] == [call.hold]
            assert used(await balances(gw, admin, tenant)) == charged


def call_message(request_id: object, arguments: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {
                "name": "procure__place_order",
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        }
    ).encode()


async def test_a_repeat_no_replica_acknowledged_is_not_sent(
    replicated_redis: ReplicatedRedis, tmp_path: Path
) -> None:
    """IRREV_WAIT_REPLICAS=1: the repeat of an ambiguous call claims its hold with a
    waited write; with the replica SIGSTOPped (a partition) the claim is acknowledged
    by none, so the call is not sent again (a failover could lose its charge): a 503
    not_replicated tool error, still charged and ambiguous. Once the replica is back
    the repeat is sent. Before, the repeat was sent at once (failed here)."""
    with redis.Redis.from_url(replicated_redis.replica.url) as client:
        replica_pid = int(client.info("server")["process_id"])
    settings = {"IRREV_WAIT_REPLICAS": "1", "IRREV_WAIT_TIMEOUT_MS": "500"}
    async with ambiguous_call(
        tmp_path, replicated_redis.primary.url, "mcp-wait", **settings
    ) as call:
        tenant, admin, own = call.tenant, call.gateway.admin, call.tools_http
        calls = (await tool_stats(own, tenant))["calls"]
        async with httpx.AsyncClient(base_url=call.gateway.url, trust_env=False) as gw:
            charged = used(await balances(gw, admin, tenant))
            os.kill(replica_pid, signal.SIGSTOP)
            try:
                async with agent(call.gateway.url, tenant.auth("buyer-01")) as client:
                    again = await client.call_tool("procure__place_order", order(), meta=call.meta)
                assert again.is_error
                assert structured(again)["reason"] == "not_replicated", again
                assert (await tool_stats(own, tenant))["calls"] == calls  # not sent
                base = f"/v1/admin/tenants/{tenant.id}"
                listed = await gw.get(f"{base}/holds?state=ambiguous", headers=admin)
                assert [h["hold"] for h in listed.json()] == [call.hold]
                assert used(await balances(gw, admin, tenant)) == charged
            finally:
                os.kill(replica_pid, signal.SIGCONT)
            async with agent(call.gateway.url, tenant.auth("buyer-01")) as client:
                for _ in range(20):
                    sent = await client.call_tool("procure__place_order", order(), meta=call.meta)
                    if not sent.is_error:
                        break
                    assert structured(sent)["reason"] == "not_replicated", sent
                    await asyncio.sleep(0.5)
            assert not sent.is_error, sent
            stats = await tool_stats(own, tenant)
            assert (stats["calls"], stats["effects"]) == (calls + 1, 1)


async def test_a_keyless_call_is_its_content_whatever_its_json_rpc_id(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """A host that sends no key repeats a call under a new JSON-RPC id (1, then "1",
    then 1 again, on a session or not): the call is keyed by its content, so every
    repeat is the first call's effect, answered from it (issue 29). A key derived
    from Mcp-Session-Id + id made each new id a new payment."""
    tenant = mcp_gateway.tenant("hostile")
    session = f"ids-{uuid.uuid4().hex}"
    # Arguments no other test of the tenant sends: an identical call of theirs within
    # the dedupe window would be this one's effect.
    supplier = f"s-{uuid.uuid4().hex[:8]}"

    async def post(request_id: object) -> dict[str, Any]:
        response = await http.post(
            "/mcp",
            content=call_message(request_id, order(quantity=1, supplier_id=supplier)),
            headers={
                **tenant.auth("buyer-01"),
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": MODERN,
                "Mcp-Method": "tools/call",
                "Mcp-Name": "procure__place_order",
                "Mcp-Session-Id": session,
            },
        )
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        assert not result.get("isError"), result
        return result

    calls = (await tool_stats(tools_http, tenant))["calls"]
    number, text = await post(1), await post("1")
    assert number["_meta"][KEY_META] == text["_meta"][KEY_META]
    assert number["_meta"][KEY_META].startswith("content-")
    assert number["structuredContent"]["effect"] == text["structuredContent"]["effect"]
    assert (await post(1))["structuredContent"] == number["structuredContent"]
    assert (await tool_stats(tools_http, tenant))["calls"] == calls + 1
