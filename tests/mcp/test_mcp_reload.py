"""A policy reload keeps the MCP clients of servers it did not change, and closes the
clients of the ones it changed or dropped once the deliveries begun through them have
ended: before, every reload left the old clients (and their sockets) open."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import yaml

from gateway.state.mcp_upstream import HttpConnection
from gateway.state.tenants import TenantStore
from ledger.client import Ledger

from .conftest import write_mcp_policy


async def test_a_reload_closes_the_clients_it_replaced(redis_url: str, tmp_path: Path) -> None:
    tenant = write_mcp_policy(tmp_path, f"mcp-reload-{uuid.uuid4().hex[:8]}", "http://127.0.0.1:9")
    ledger = Ledger.from_url(redis_url)
    store = TenantStore(tmp_path)
    try:
        await store.load(ledger)
        procure = store.mcp_upstream(tenant.id, "procure")
        github = store.mcp_upstream(tenant.id, "github")
        assert procure is not None and github is not None
        assert isinstance(procure.connection, HttpConnection)
        assert isinstance(github.connection, HttpConnection)
        procure_client, github_client = procure.connection.client(), github.connection.client()

        path = tmp_path / f"{tenant.id}.yaml"
        data = yaml.safe_load(path.read_text())
        data["tools"]["procure"]["mcp"] = "http://127.0.0.1:10/mcp"
        path.write_text(yaml.safe_dump(data))
        await store.apply(ledger)
        assert store.mcp_upstream(tenant.id, "github") is github  # unchanged: kept
        moved = store.mcp_upstream(tenant.id, "procure")
        assert moved is not None and moved is not procure
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not procure_client.is_closed:
            assert loop.time() < deadline, "the replaced client was never closed"
            await asyncio.sleep(0.05)
        assert not github_client.is_closed
        await store.aclose()
        assert github_client.is_closed
    finally:
        await ledger.aclose()
