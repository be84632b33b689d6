"""`/mcp`: irrev as an MCP server (Streamable HTTP, the official SDK's low-level
`Server`), in front of the tenant's MCP servers. An agent connects an ordinary MCP
client with its Bearer token and sees the tools it may call; each `tools/call` goes
through the admission pipeline (price -> reserve -> deliver once -> settle) with the
tenant's MCP server as its `Upstream` (gateway/state/mcp_upstream.py).

Stateless: each POST stands alone (the 2026-07-28 protocol has no sessions; older
clients get the SDK's stateless mode), so any worker serves any request. What an
agent gets (docs/policy.md, "MCP servers"): the tool's own result when admitted; a
result with `isError: true`, a sentence and `structuredContent.reason` when refused;
a pending result naming the escalation when a human must decide, which the same
call with the same idempotency key turns into the real result once approved."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope, Send

from gateway.edge.advice import duration_text
from gateway.edge.auth import agent_of
from gateway.edge.bodies import read_body
from gateway.edge.canonical import Canonical
from gateway.edge.problems import Problem, noted, problem_for
from gateway.edge.responses import escalation_id
from gateway.edge.wire import JsonNumber, parse_json_body
from gateway.pipeline.mcp_pipeline import Outcome, call_effect
from gateway.pipeline.prepare import Gate
from gateway.routes.mcp_results import answered, held, refused, rpc_refusal
from gateway.state import refusals
from gateway.state.mcp_upstream import KEY_META
from ledger import HoldState, LedgerError
from pricing import (
    AuthenticatedAgent,
    BodyFormat,
    CompiledRoute,
    EffectClass,
    PricedEffect,
    RequestError,
    TenantPolicy,
    call_route,
    minor_to_major_text,
)

SEPARATOR = "__"
# An escalated call waiting for its decision reads the hold this often: first soon
# (an approval a person had queued lands fast), then every second.
FIRST_POLL_S = 0.2
LAST_POLL_S = 1.0
UNDECIDED = frozenset(
    {HoldState.ESCALATED, HoldState.PENDING}
)  # `<server>__<tool>`: names OpenAI's and Anthropic's tool APIs accept
CALLER = "irrev.mcp"
TOOLS_TTL_S = 10.0
AGENT_KEY = re.compile(r"[\x21-\x7e]{1,255}")


@dataclass
class McpCall:
    """Who sent this POST, and its JSON-RPC message as parsed strictly (numbers exact,
    no NaN, no duplicate keys, bounded depth): what `tools/call` prices."""

    gate: Gate
    policy: TenantPolicy
    agent: AuthenticatedAgent
    message: object


# The POST being served, for what the SDK asks without a request context
# (tool_input_schema): set by McpEndpoint, in the task that serves the POST.
CURRENT: ContextVar[McpCall] = ContextVar("irrev_mcp_caller")


def caller_of(ctx: ServerRequestContext[Any, Any]) -> McpCall:
    assert ctx.request is not None
    caller: McpCall = ctx.request.scope[CALLER]
    return caller


def split_name(name: str) -> tuple[str, str]:
    server, sep, tool = name.partition(SEPARATOR)
    if not sep or not server or not tool:
        raise Problem(
            403, "unknown_route", f"{name!r} is not a tool of this gateway: '<server>__<tool>'"
        )
    return server, tool


def servers_of(policy: TenantPolicy) -> list[str]:
    return sorted(name for name, tool in policy.document.tools.items() if tool.is_mcp)


def route_effect(server: str, target: str, route: CompiledRoute) -> PricedEffect:
    """A route as the allow-list check reads it (no request: no price)."""
    return PricedEffect.unpriced(server, route.method, target, route)


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
    window = route.dedupe_window_ms
    if route.keyless and window:
        note += (
            f". An identical call (same arguments) within {duration_text(window)} of the "
            "first one's outcome is the same call: it returns that outcome and is not made "
            "again"
        )
    return note + "."


def shown(
    policy: TenantPolicy, agent: AuthenticatedAgent, server: str, tool: str
) -> CompiledRoute | None:
    """The route of a tool this agent is shown (a priced route both allow-lists let it
    call), None for one it is not: an unpriced tool is never called."""
    try:
        operation, target = call_route(server, tool)
    except RequestError:
        return None  # a name no route can have
    found = policy.catalog.match(server, operation, target)
    if found is None:
        return None
    effect = route_effect(server, target, found[0])
    members = (f"agent:{agent.agent_id}", f"principal:{agent.principal_id}")
    if not all(policy.scopes.allows(member, effect) for member in members):
        return None
    return found[0]


def tool_input_schema(name: str) -> Mapping[str, Any] | None:
    """A listed tool's input schema, which the SDK checks a `tools/call`'s `Mcp-Param-*`
    headers against before dispatch. Given no such lookup, the SDK would run
    list_tools for every call; this reads the server's cached listing instead (kept
    past its TTL: a server's schemas rarely change, and the check fails open). None
    (the SDK skips the check) for a tool the agent is not shown or never listed."""
    caller = CURRENT.get(None)
    server, sep, tool = name.partition(SEPARATOR)
    if caller is None or not sep:
        return None
    upstream = caller.gate.tenants.mcp_upstream(caller.policy.tenant, server)
    if upstream is None or shown(caller.policy, caller.agent, server, tool) is None:
        return None
    listed = upstream.listed(tool)
    return listed.input_schema if listed is not None else None


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
            route = shown(policy, agent, server, tool.name)
            if route is None:
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


def _arguments(caller: McpCall, request_id: object) -> object:
    """The call's `arguments` as strictly parsed (the SDK's lenient parse is only used
    to route the message)."""
    message = caller.message
    if isinstance(message, dict) and message.get("id") == request_id:
        params = message.get("params")
        if isinstance(params, dict):
            return params.get("arguments", {})
    raise Problem(400, "bad_request", "send one JSON-RPC request per POST")


def agent_key(params: types.CallToolRequestParams) -> str:
    """The agent's idempotency key, `_meta["dev.irrev/idempotency_key"]`, or '' when it
    sent none: desktop and IDE hosts send no `_meta`, so such a call is keyed by its
    content (its route's `keyless`), and a model's repeat of it is the same effect."""
    meta = dict(params.meta or {})
    if KEY_META not in meta:
        return ""
    key = meta[KEY_META]
    if not isinstance(key, str) or not AGENT_KEY.fullmatch(key):
        raise Problem(
            400, "bad_idempotency_key", f"_meta {KEY_META!r} must be 1-255 printable ASCII"
        )
    return key


async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    caller = caller_of(ctx)
    key = ""
    try:
        server, tool = split_name(params.name)
        key = agent_key(params)
        document = _arguments(caller, ctx.request_id)
        if not isinstance(document, dict):
            raise Problem(422, "bad_request", "arguments must be a JSON object")
        canonical = Canonical((), BodyFormat.JSON, document)
        outcome = await call_effect(
            caller.gate, caller.policy, caller.agent, server, tool, canonical, key
        )
        wait_s = outcome.decision.wait_s if outcome.decision is not None else 0.0
        if outcome.escalated and wait_s > 0 and waits(params, key):
            outcome = await wait_for_decision(
                ctx, caller, server, tool, canonical, outcome, by_content=not key
            )
    except (Problem, RequestError, LedgerError) as exc:
        # As the HTTP routes answer them (gateway/edge/problems.py), as a tool result.
        problem = problem_for(exc)
        held_under = problem.extra.get("idempotency_key")
        result = refused(problem, key, held(key, held_under if isinstance(held_under, str) else ""))
    else:
        result = answered(outcome, caller.policy, key)
    refusals.seen_call(caller.gate, caller.policy, caller.agent.agent_id, params.name, result)
    return result


def waits(params: types.CallToolRequestParams, key: str) -> bool:
    """Whether an escalated call waits for the decision: one without a key (a desktop
    or IDE host, which can neither poll nor repeat a key: its model would only ask
    again), or one whose client asked for progress. A client that sends its own key
    and no progress token is a program that repeats the key when it will: answered at
    once, it is not held up behind a person."""
    # The SDK reads the wire's `progressToken` into the meta's `progress_token`.
    return not key or (params.meta or {}).get("progress_token") is not None


async def wait_for_decision(
    ctx: ServerRequestContext[Any, Any],
    caller: McpCall,
    server: str,
    tool: str,
    canonical: Canonical,
    escalated: Outcome,
    *,
    by_content: bool,
) -> Outcome:
    """An escalated call held open for the person's decision, up to its route's
    `escalation_wait`: an MCP host cannot poll, and its model, told to wait, would only
    ask again. Progress notifications go to a client that asked for them (a progress
    token), which some clients take to extend their timeout. Decided in time: the same
    call again under the key it is held under, which replays the hold's outcome
    (`by_content`: its content's key, for a call sent without one)."""
    gate, policy = caller.gate, caller.policy
    decision = escalated.decision
    assert decision is not None
    escalation = escalation_id(policy.tenant, decision.hold_id)
    started = time.monotonic()
    deadline = started + decision.wait_s
    pause_s = FIRST_POLL_S
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, LAST_POLL_S)
        hold = await gate.ledger.hold(policy.tenant, decision.hold_id)
        if hold is None or hold.state not in UNDECIDED:
            decided = await call_effect(
                gate,
                policy,
                caller.agent,
                server,
                tool,
                canonical,
                decision.key,
                by_content=by_content,
            )
            if decided.decision is None:
                return decided
            # This very call, decided now: not the replay of an earlier one.
            return replace(decided, decision=replace(decided.decision, replayed=False))
        waited = time.monotonic() - started
        await ctx.session.report_progress(
            waited, decision.wait_s, f"waiting for a person to decide escalation {escalation}"
        )
    return replace(escalated, waited_s=decision.wait_s)


@dataclass
class McpEndpoint:
    """The ASGI app at `/mcp`: the agent's Bearer token, a strict parse of the POST,
    then the SDK's Streamable HTTP transport (stateless): JSON answers, but an event
    stream for a `tools/call` whose client asked for progress and takes one, so that
    a call waiting for a person's decision can report it (wait_for_decision)."""

    manager: StreamableHTTPSessionManager
    streaming: StreamableHTTPSessionManager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate: Gate = scope["app"].state.gate
        request = Request(scope, receive)
        try:
            found = agent_of(request, gate.tenants)
            # The agent's slot is taken before its body is read: reading, parsing and
            # serving are what the bound limits (gateway/edge/in_flight.py).
            with gate.agents.slot(*found):
                await self._serve(gate, found, request, send)
        except Problem as problem:
            # Counted and logged as every HTTP refusal is; a POST's answered so that the
            # agent's MCP client reads its sentence.
            noted(request, problem)
            post = scope["method"] == "POST"
            await (rpc_refusal(problem) if post else problem.response())(scope, receive, send)
        except ClientDisconnect:
            return  # gone before its body was whole: nobody to answer

    async def _serve(
        self,
        gate: Gate,
        found: tuple[TenantPolicy, AuthenticatedAgent],
        request: Request,
        send: Send,
    ) -> None:
        """Read and parse the POST strictly (a Problem if it cannot be), then serve it."""
        scope = request.scope
        limits = found[0].document.request_limits
        largest = min(gate.settings.max_body_bytes, limits.max_body_bytes)
        body = await read_body(request, largest, gate.settings.body_timeout_s)
        message = parse_json_body(body, limits) if scope["method"] == "POST" else None
        check_numbers(message)
        caller = scope[CALLER] = McpCall(gate, found[0], found[1], message)
        manager = self.streaming if wants_progress(scope, message) else self.manager
        token = CURRENT.set(caller)
        try:
            await manager.handle_request(scope, _replay(body, request.receive), send)
        finally:
            CURRENT.reset(token)


def wants_progress(scope: Scope, message: object) -> bool:
    """A `tools/call` with a progress token, from a client that accepts an event stream."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or "progressToken" not in meta:
        return False
    accept = b",".join(v for k, v in scope["headers"] if k == b"accept")
    return b"text/event-stream" in accept


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


def build() -> tuple[StreamableHTTPSessionManager, StreamableHTTPSessionManager]:
    """The transports of McpEndpoint: JSON answers, and event streams."""
    server: Server[Any] = Server(
        "irrev",
        version="0.1.0",
        get_tool_input_schema=tool_input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    # No DNS-rebinding checks: every request carries an agent's Bearer token, which a
    # page in a browser cannot send for it.
    return (
        StreamableHTTPSessionManager(app=server, json_response=True, stateless=True),
        StreamableHTTPSessionManager(app=server, json_response=False, stateless=True),
    )
