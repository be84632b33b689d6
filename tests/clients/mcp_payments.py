"""An MCP payments server that pays every call it gets, the kind most MCP servers are:
it reads no idempotency key (whatever `_meta` a call carries, it pays again), so a call
made twice is two payments. Built with the official SDK's `MCPServer`, served over
Streamable HTTP (stateless, JSON answers) at `/mcp` by uvicorn in its own process:

    MCP_PAYMENTS_LEDGER=/tmp/paid.jsonl uvicorn tests.clients.mcp_payments:app --port 8912

Every payment is appended to `MCP_PAYMENTS_LEDGER` (JSON lines: id, recipient, amount,
the `_meta` keys its call carried) before the tool answers. Test-only HTTP routes:
`GET /_payments` (every payment, in order), `GET /_ready`, and `POST /_faults
{"next": "timeout" | "504"}`: the next payment is made and then not answered: the tool
sleeps past any gateway's upstream timeout, or the HTTP answer becomes a 504, as a
proxy in front of a slow server answers. Either way the payer cannot tell that it paid.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LEDGER = Path(os.environ.get("MCP_PAYMENTS_LEDGER", "/tmp/irrev-mcp-payments.jsonl"))
# Longer than any upstream or client timeout the tests use, short enough that a hung
# call does not outlive its test by much.
HANG_S = 30.0
FAULTS = ("timeout", "504")
# Set on the request's ASGI scope by the tool: answer this request with a 504.
ANSWER_504 = "mcp_payments.answer_504"

server = MCPServer("payments", version="1")
# The fault armed for the next payment: at most one, used once.
armed: list[str] = []


def payments() -> list[dict[str, Any]]:
    if not LEDGER.exists():
        return []
    return [json.loads(line) for line in LEDGER.read_text().splitlines()]


def record(payment: dict[str, Any]) -> None:
    with LEDGER.open("a") as out:
        out.write(json.dumps(payment) + "\n")
        out.flush()
        os.fsync(out.fileno())


@server.tool()
async def pay(recipient: str, amount: int, ctx: Context) -> dict[str, Any]:
    """Pay `amount` USD to `recipient`. Every call is a payment."""
    meta = ctx.request_context.meta or {}
    payment = {"id": f"pay_{len(payments()) + 1}", "recipient": recipient, "amount": amount}
    record({**payment, "meta": sorted(meta)})
    fault = armed.pop() if armed else None
    if fault == "timeout":
        await asyncio.sleep(HANG_S)
    elif fault == "504":
        request = ctx.request_context.request
        assert isinstance(request, Request)
        request.scope[ANSWER_504] = True
    return payment


@server.custom_route("/_payments", methods=["GET"])
async def listed(request: Request) -> Response:
    return JSONResponse(payments())


@server.custom_route("/_faults", methods=["POST"])
async def faults(request: Request) -> Response:
    fault = (await request.json()).get("next")
    if fault not in FAULTS:
        return JSONResponse({"error": f"next must be one of {FAULTS}"}, 422)
    armed[:] = [fault]
    return JSONResponse({"next": fault})


@server.custom_route("/_ready", methods=["GET"])
async def ready(request: Request) -> Response:
    return JSONResponse({})


class GatewayTimeout:
    """Answers 504 in place of the MCP answer of a request whose tool asked for it
    (after the payment was made), as a reverse proxy does when the server is slow."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def answer(message: Message) -> None:
            if not scope.get(ANSWER_504):
                await send(message)
            elif message["type"] == "http.response.start":
                await send({"type": "http.response.start", "status": 504, "headers": []})
                await send({"type": "http.response.body", "body": b""})

        await self.app(scope, receive, answer)


app = GatewayTimeout(server.streamable_http_app(json_response=True, stateless_http=True))
