"""The peer `irrev bench mcp` measures irrev against: FastMCP's proxy in front of the
same MCP server, over one client session it connects at start and reuses for every
call (FastMCP reuses a connected client's session), JSON answers, served over
Streamable HTTP at `/mcp` by uvicorn. What a proxy costs without pricing, a ledger or
idempotency: `python -m irrev.bench.mcp_peer --port P --upstream URL` (the `bench`
extra installs FastMCP's server)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from fastmcp import Client
from fastmcp.server import create_proxy
from starlette.requests import Request
from starlette.responses import PlainTextResponse


async def serve(port: int, upstream: str) -> None:
    async with Client(upstream) as client:  # connected: one session for every call
        proxy: Any = create_proxy(client, name="peer")

        @proxy.custom_route("/ready", methods=["GET"])
        async def ready(request: Request) -> PlainTextResponse:
            return PlainTextResponse("ready")

        await proxy.run_http_async(
            show_banner=False,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            json_response=True,
            stateless_http=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the MCP server's URL")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.upstream))


if __name__ == "__main__":
    main()
