"""IRREV_WAIT_REPLICAS for MCP callers: a call no replica acknowledged is released
before anything is sent, and the agent reads not_replicated, with where its key goes
(`_meta`), live, on a repeat of the call and after an approval. A real primary and
replica (redis-server processes); the replica is SIGKILLed mid-test."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ReplicatedRedis
from tests.gateway.servers import Server

from .conftest import (
    KEY_META,
    agent,
    key,
    order,
    serve,
    structured,
    text_of,
    tool_stats,
    write_mcp_policy,
)

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


async def test_an_unreplicated_call_is_refused_as_such_live_repeated_and_approved(
    replicated_redis: ReplicatedRedis,
    tool_server: Server,
    tools_http: httpx.AsyncClient,
    tmp_path: Path,
) -> None:
    """A repeat of the call, and the repeat that polls an approved escalation, get the
    refusal kept with the released hold: it was turned into upstream_unreachable ("the
    MCP server could not be reached"), and the approval's told MCP callers to send a
    new Idempotency-Key header (failed before the fix)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    tenant = write_mcp_policy(policies, f"mcp-replicas-{uuid.uuid4().hex[:8]}", tool_server.url)
    gateway = serve(
        tmp_path,
        replicated_redis.primary.url,
        policies,
        IRREV_WAIT_REPLICAS="1",
        IRREV_WAIT_TIMEOUT_MS="300",
    )
    deletion, deletion_key = {"owner": "acme", "repo": "legacy"}, key()
    meta = key()
    try:
        async with (
            agent(gateway.url, tenant.auth("dev-01")) as dev,
            agent(gateway.url, tenant.auth("buyer-01")) as buyer,
            httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http,
        ):
            escalated = await dev.call_tool(
                "github__delete_repository", deletion, meta=deletion_key
            )
            escalation = structured(escalated)["escalation"]
            await asyncio.to_thread(replicated_redis.replica.kill)
            first = await buyer.call_tool("procure__place_order", order(), meta=meta)
            again = await buyer.call_tool("procure__place_order", order(), meta=meta)
            approved = await http.post(
                f"/v1/escalations/{escalation}/approve", headers=tenant.admin_auth
            )
            assert approved.status_code == 503, approved.text
            polled = await dev.call_tool("github__delete_repository", deletion, meta=deletion_key)
    finally:
        gateway.server.stop()
    for result in (first, again, polled):
        assert result.is_error
        assert structured(result)["reason"] == "not_replicated", result
        text = text_of(result.content[0])
        assert KEY_META in text and "Idempotency-Key" not in text, text
    assert (await tool_stats(tools_http, tenant))["calls"] == 0  # nothing was sent
