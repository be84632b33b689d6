"""`/mcp`: irrev as an MCP server (Streamable HTTP, the official SDK's low-level
`Server`), in front of the tenant's MCP servers. An agent connects an ordinary MCP
client with its Bearer token and sees the tools it may call; each `tools/call` goes
through the admission pipeline (price -> reserve -> deliver once -> settle) with the
tenant's MCP server as its `Upstream` (gateway/mcp_upstream.py).

Stateless: each POST stands alone (the 2026-07-28 protocol has no sessions; older
clients get the SDK's stateless mode), so any worker serves any request. What an
agent gets (docs/policy.md, "MCP servers"): the tool's own result when admitted; a
result with `isError: true`, a sentence and `structuredContent.reason` when refused;
a pending result naming the escalation when a human must decide, which the same
call with the same idempotency key turns into the real result once approved."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import secrets
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Message, Receive, Scope, Send

from ledger import LedgerError
from pricing import EffectClass, PricedEffect, TenantPolicy
from pricing.catalog import CompiledRoute
from pricing.credentials import AuthenticatedAgent
from pricing.errors import RequestError
from pricing.money import minor_to_major_text
from pricing.policy import BodyFormat

from .admission import Gate
from .canonical import Canonical
from .mcp_pipeline import Outcome, call_effect
from .mcp_upstream import HOLD_META, KEY_META
from .problems import Problem, body_timeout, problem_for
from .responses import escalation_id
from .upstream import Fate
from .wire import JsonNumber, parse_json_body

SEPARATOR = "__"  # `<server>__<tool>`: names OpenAI's and Anthropic's tool APIs accept
CALLER = "irrev.mcp"
TOOLS_TTL_S = 10.0
PRICE_META = "dev.irrev/price"
AGENT_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@dataclass
class Caller:
    """Who sent this POST, and its JSON-RPC message as parsed strictly (numbers exact,
    no NaN, no duplicate keys, bounded depth): what `tools/call` prices."""

    gate: Gate
    policy: TenantPolicy
    agent: AuthenticatedAgent
    message: object
    session: str = ""


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    assert ctx.request is not None
    caller: Caller = ctx.request.scope[CALLER]
    return caller


def split_name(name: str) -> tuple[str, str]:
    server, sep, tool = name.partition(SEPARATOR)
    if not sep or not server or not tool:
        raise Problem(
            403, "unknown_route", f"{name!r} is not a tool of this gateway: '<server>__<tool>'"
        )
    return server, tool


def servers_of(policy: TenantPolicy) -> list[str]:
    return sorted(name for name, tool in policy.document.tools.items() if tool.mcp)


def route_effect(server: str, tool: str, route: CompiledRoute) -> PricedEffect:
    """A route as the allow-list check reads it (no request: no price)."""
    return PricedEffect(
        server, route.method, f"/{tool}", route, route.effect_class, 0, (), 0, route.model, None
    )


def pricing_note(policy: TenantPolicy, route: CompiledRoute) -> str:
    """How irrev prices the tool, for the model reading `tools/list`."""
    unit = policy.document.risk_unit.currency
    if route.effect_class is EffectClass.READ:
        return "[irrev] effect class: read; free."
    if route.face_fixed_micros is not None:
        face = f"a fixed face value of {minor_to_major_text(route.face_fixed_micros, policy.scale)}"
    else:
        face = "face value " + " * ".join(route.face_fields) + " (from the arguments)"
    note = (
        f"[irrev] effect class: {route.effect_class.value}; priced at {face} x "
        f"{route.loss_factor:.4g} ({route.model}) in {unit}, debited from the fleet's budget"
    )
    if route.approval_threshold_micros is not None:
        threshold = minor_to_major_text(route.approval_threshold_micros, policy.scale)
        note += f"; a price above {threshold} {unit} waits for a human"
    return note + f". Send `_meta: {{{KEY_META!r}: <your tool-call id>}}` to make retries safe."


async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """The union of the tenant's MCP servers' tools that this agent may call (a listed
    route and both allow-lists), each described with its effect class and price."""
    caller = caller_of(ctx)
    policy, agent = caller.policy, caller.agent
    listed: list[types.Tool] = []
    for server in servers_of(policy):
        upstream = caller.gate.tenants.mcp_upstream(policy.tenant, server)
        if upstream is None:
            continue
        deadline = time.monotonic() + caller.gate.settings.upstream_timeout_s
        for tool in await upstream.list_tools(deadline, TOOLS_TTL_S):
            found = policy.catalog.match(server, "CALL", f"/{tool.name}")
            if found is None:
                continue  # unpriced: never called, so not shown
            route = found[0]
            effect = route_effect(server, tool.name, route)
            members = (f"agent:{agent.agent_id}", f"principal:{agent.principal_id}")
            if not all(policy.scopes.allows(member, effect) for member in members):
                continue
            description = (tool.description or "").strip()
            listed.append(
                tool.model_copy(
                    update={
                        "name": f"{server}{SEPARATOR}{tool.name}",
                        "description": f"{description}\n\n{pricing_note(policy, route)}".strip(),
                    }
                )
            )
    return types.ListToolsResult(tools=listed)


def _arguments(caller: Caller, request_id: object) -> object:
    """The call's `arguments` as strictly parsed (the SDK's lenient parse is only used
    to route the message)."""
    message = caller.message
    if isinstance(message, dict) and message.get("id") == request_id:
        params = message.get("params")
        if isinstance(params, dict):
            return params.get("arguments", {})
    raise Problem(400, "bad_request", "send one JSON-RPC request per POST")


def agent_key(caller: Caller, params: types.CallToolRequestParams, request_id: object) -> str:
    """The agent's idempotency key: `_meta["dev.irrev/idempotency_key"]` when it sends
    one; else derived from its MCP session and the JSON-RPC id when the client has a
    session; else a new key (each such call is its own effect, and the result names
    the key, so that the agent can repeat the call safely with it)."""
    meta = dict(params.meta or {})
    if KEY_META in meta:
        key = meta[KEY_META]
        if not isinstance(key, str) or not AGENT_KEY.fullmatch(key):
            raise Problem(
                400, "bad_idempotency_key", f"_meta {KEY_META!r} must be 1-255 printable ASCII"
            )
        return key
    if caller.session:
        material = f"{caller.session}\x00{request_id}".encode()
        return "mcp-session-" + hashlib.sha256(material).hexdigest()[:32]
    return "mcp-" + secrets.token_hex(16)


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    caller = caller_of(ctx)
    key = ""
    try:
        server, tool = split_name(params.name)
        key = agent_key(caller, params, ctx.request_id)
        document = _arguments(caller, ctx.request_id)
        if not isinstance(document, dict):
            raise Problem(422, "bad_request", "arguments must be a JSON object")
        canonical = Canonical((), BodyFormat.JSON, document)
        outcome = await call_effect(
            caller.gate, caller.policy, caller.agent, server, tool, canonical, key
        )
    except (Problem, RequestError, LedgerError) as exc:
        # As the HTTP routes answer them (gateway/problems.py), as a tool result.
        return refused(problem_for(exc), caller.policy, key)
    return answered(outcome, caller.policy, key)


def refused(problem: Problem, policy: TenantPolicy, key: str) -> types.CallToolResult:
    """A refusal the model can act on: one sentence (reason, price, what is left) and
    the problem's fields as structured content."""
    unit = policy.document.risk_unit.currency
    extra = problem.extra
    sentence = f"irrev refused this call ({problem.reason}): {problem.detail}."
    if isinstance(extra.get("price"), int):
        sentence += f" Price: {minor_to_major_text(extra['price'], policy.scale)} {unit}."
    if isinstance(extra.get("available"), int):
        left = minor_to_major_text(max(extra["available"], 0), policy.scale)
        sentence += f" Left on {extra.get('account')}: {left} {unit}."
    structured = {"reason": problem.reason, "status": problem.status, "detail": problem.detail}
    structured |= {k: v for k, v in extra.items() if isinstance(v, str | int | float | None)}
    if key:
        structured["idempotency_key"] = key
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=sentence)],
        structured_content=structured,
        is_error=True,
    )


def answered(outcome: Outcome, policy: TenantPolicy, key: str) -> types.CallToolResult:
    meta: dict[str, Any] = {KEY_META: key}
    if outcome.hold_id:
        meta |= {HOLD_META: outcome.hold_id, PRICE_META: outcome.price}
    if outcome.escalated:
        escalation = escalation_id(policy.tenant, outcome.hold_id)
        price = minor_to_major_text(outcome.price, policy.scale)
        unit = policy.document.risk_unit.currency
        text = (
            f"This call waits for a human's approval (escalation {escalation}, price {price} "
            f"{unit}): nothing was done yet. Make the same call again with _meta "
            f"{{{KEY_META!r}: {key!r}}} to get its result once it is approved."
        )
        structured = {
            "status": "escalated",
            "escalation": escalation,
            "idempotency_key": key,
            "price": outcome.price,
        }
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=structured,
            is_error=True,
            _meta=meta,
        )
    if outcome.problem is not None:
        return refused(outcome.problem, policy, key)
    result = types.CallToolResult.model_validate_json(outcome.body)
    if outcome.fate is Fate.UNKNOWN:
        note = (
            "irrev: the tool reported an error, so whether it acted is unknown; the call "
            "stays charged until reconciled. Repeat it with the same idempotency key "
            f"({key!r}) to learn the outcome; never with a new one."
        )
        result.content.append(types.TextContent(type="text", text=note))
    merged = {**(result.meta or {}), **meta}
    return result.model_copy(update={"meta": merged})


@dataclass
class McpEndpoint:
    """The ASGI app at `/mcp`: the agent's Bearer token, a strict parse of the POST,
    then the SDK's Streamable HTTP transport (stateless, JSON answers)."""

    manager: StreamableHTTPSessionManager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate: Gate = scope["app"].state.gate
        try:
            found = gate.tenants.authenticate(_bearer(scope))
            if found is None:
                raise Problem(
                    401,
                    "unauthenticated",
                    "send 'Authorization: Bearer <agent token>'",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            body = await _read_body(
                receive, gate.settings.max_body_bytes, gate.settings.body_timeout_s
            )
            message = parse_json_body(body) if scope["method"] == "POST" else None
            check_numbers(message)
        except Problem as problem:
            await problem.response()(scope, receive, send)
            return
        headers = dict(scope["headers"])
        session = headers.get(b"mcp-session-id", b"").decode("latin-1")
        scope[CALLER] = Caller(gate, found[0], found[1], message, session)
        await self.manager.handle_request(scope, _replay(body, receive), send)


def check_numbers(value: object) -> None:
    """Arguments reach the MCP server as the SDK serialises them: a number with a
    fraction as a double. One a double cannot hold exactly would be read there as
    another number than the one priced, so it is refused."""
    if isinstance(value, dict):
        for item in value.values():
            check_numbers(item)
    elif isinstance(value, list):
        for item in value:
            check_numbers(item)
    elif isinstance(value, JsonNumber):
        as_double = float(value)
        if not math.isfinite(as_double) or Decimal(repr(as_double)) != value:
            raise Problem(
                400,
                "bad_json",
                f"the number {value.text} has more digits than a double holds: the MCP "
                "server would read another number than the one priced; send it as a string",
            )


def _bearer(scope: Scope) -> str:
    values = [v for k, v in scope["headers"] if k == b"authorization"]
    if len(values) > 1:
        raise Problem(400, "bad_authorization", "send exactly one Authorization header")
    scheme, _, token = (values[0].decode("latin-1") if values else "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _read_body(receive: Receive, limit: int, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_chunks(receive, limit)
    except TimeoutError:
        raise body_timeout(timeout_s) from None


async def _read_chunks(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Problem(413, "body_too_large", f"request bodies are limited to {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then whatever the connection says next (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def build() -> StreamableHTTPSessionManager:
    server: Server[Any] = Server(
        "irrev", version="0.1.0", on_list_tools=list_tools, on_call_tool=call_tool
    )
    # No DNS-rebinding checks: every request carries an agent's Bearer token, which a
    # page in a browser cannot send for it.
    return StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)
