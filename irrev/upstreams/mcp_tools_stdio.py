"""The test tool server's tools (irrev/upstreams/mcp_tools.py) as a stdio MCP server,
the kind irrev runs itself (`tools.<name>.mcp_command`):

    python -m irrev.upstreams.mcp_tools_stdio <namespace>

serves one namespace. Each gateway worker runs its own process of it, so every process
of a namespace shares its files in MCP_TOOL_STATE (the environment irrev gives it):
the effects made (`<ns>.jsonl`, read again before each call), the calls received
(`<ns>.calls.jsonl`, each with the pid that received it), the faults a test sets
(`<ns>.faults.json`, as the HTTP server's `_faults`), and one line per start
(`<ns>.starts.jsonl`: pid, arguments, parent pid, working directory, the names of its
environment, the SHA-256 of MCP_TOOL_TOKEN), so that tests see which processes ran,
for whom, and with what.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from .mcp_tools import STATE_DIR, append_line, call_in, list_tools, namespace


def started() -> dict[str, Any]:
    token = os.environ.get("MCP_TOOL_TOKEN")
    return {
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "env": sorted(os.environ),
        "token_sha256": hashlib.sha256(token.encode()).hexdigest() if token else None,
    }


async def serve(name: str) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    ns = namespace(name, shared=True)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await call_in(ns, params)

    server: Server[Any] = Server(
        "irrev-test-tools", version="1", on_list_tools=list_tools, on_call_tool=call_tool
    )
    append_line(STATE_DIR / f"{name}.starts.jsonl", started())
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1])
