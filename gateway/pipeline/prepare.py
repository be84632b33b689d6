"""Prepare: an effect as its router parsed it (`Intent`) priced, checked against
what its agent may do, and turned into what its hold keeps (`Prepared`): the request
sent upstream, the hold's id and the fingerprint that tells a repeat of its key from
a new effect. Also the `Gate` every stage is handed, and where an effect is sent."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx
from starlette.requests import HTTPConnection

from gateway.edge import tracing
from gateway.edge.advice import units_of
from gateway.edge.canonical import Canonical
from gateway.edge.in_flight import AgentSlots
from gateway.edge.problems import Problem, suspension_members
from gateway.edge.responses import amounts_in_currency
from gateway.edge.wire import Headers, StoredRequest, fingerprint, hold_id_for
from gateway.pipeline.resettle import Resettler
from gateway.pipeline.upstream import Upstream
from gateway.settings import GatewaySettings
from gateway.state.http_upstream import HTTP_KEY, HttpTarget, HttpUpstream, UpstreamSlots
from gateway.state.refusals import RefusalTally
from gateway.state.tenants import TenantStore
from ledger import (
    Ledger,
)
from pricing import (
    AuthenticatedAgent,
    EffectClass,
    PerEffectCapExceeded,
    PricedEffect,
    TenantPolicy,
    check_per_effect_cap,
    check_route_scope,
    is_shadow,
    policy_account,
    price_request,
)

log = logging.getLogger("irrev.gateway")
# A trace context is new on every attempt by design; it does not change the effect.
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_AGENT_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# The longest a keyless content's index is kept after its last use (ledger/validate.py's
# bound on a TTL).
MAX_CONTENT_KEEP_MS = 366 * 24 * 3600 * 1000
CONTENT_KEY_PREFIX = "content-"
# The key of a call sent without one on a route whose identical calls are each an
# effect of their own (`dedupe_window: 0`): random, so nothing its caller sends reaches
# it again.
KEYLESS_KEY_PREFIX = "keyless-"
# Intent.keyless_name of an HTTP request and of an MCP call.
KEYLESS_REQUEST = "request"
KEYLESS_ARGUMENTS = "arguments"
KEYLESS_NAMES = frozenset({KEYLESS_REQUEST, KEYLESS_ARGUMENTS})


def same_again(key_name: str) -> str:
    """How a caller asks again about the effect it is held for, to finish a sentence:
    with its key, or, sent without one, by making the identical call (its host may be
    unable to send a key at all)."""
    if key_name in KEYLESS_NAMES:
        return f"make the identical call again (the same {key_name})"
    return f"send it again with the same {key_name}"


@dataclass
class Gate:
    """What every request handler needs; one per worker process. `slots`: per tenant,
    its requests in flight to its HTTP upstreams (IRREV_UPSTREAM_TENANT_CONNECTIONS),
    so that one tenant's stuck upstream cannot hold every connection of `http`, which
    all tenants share."""

    settings: GatewaySettings
    ledger: Ledger
    tenants: TenantStore
    http: httpx.AsyncClient
    slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    agents: AgentSlots = field(default_factory=AgentSlots)
    # This process's refusals since their last flush to Redis (gateway/state/refusals.py).
    refusals: RefusalTally = field(default_factory=RefusalTally)
    # Settlements the ledger could not take when their fate was known.
    resettle: Resettler = field(default_factory=Resettler)

    @staticmethod
    def of(request: HTTPConnection) -> Gate:
        """The worker's Gate, which create_app keeps on the app for every request."""
        gate: Gate = request.app.state.gate
        return gate

    def tenant_slots(self, tenant: str) -> asyncio.Semaphore:
        if tenant not in self.slots:
            self.slots[tenant] = asyncio.Semaphore(self.settings.tenant_connections())
        return self.slots[tenant]


@dataclass(frozen=True, kw_only=True)
class Intent:
    """An effect as an agent asked for it, parsed by its router, in the words of the
    route it is addressed to: `operation` and `target` are the route's verb and what
    it names (an HTTP method and path, starting with '/'; for an MCP tool, what its
    `CALL <server>/<tool>` route reads as: pricing's `call_route`); `canonical` is the query
    and body as they are priced and forwarded; `headers` are the agent's headers its
    tool lets through (lower-case names, sorted); `keys` are the idempotency keys the
    agent sent (anything held needs exactly one)."""

    tool: str
    operation: str
    target: str
    canonical: Canonical
    keys: Sequence[str] = ()
    headers: Headers = ()
    key_name: str = HTTP_KEY
    # What a call sent without a key repeats to be the same effect, for the sentences
    # that say so ("the same request", MCP's "the same arguments").
    keyless_name: str = KEYLESS_REQUEST


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A priced, checked effect and what its hold keeps. `hold_id`, `fingerprint` and
    `agent_key` (the agent's Idempotency-Key) are '' for a proxied read, which holds
    nothing."""

    effect: PricedEffect
    request: StoredRequest
    hold_id: str
    fingerprint: str
    # Shadow mode (the route's or the tenant's): never blocking. `cap_refusal` is the
    # reason of a refusal made before the ledger (the per-effect cap) let through.
    shadow: bool = False
    cap_refusal: str = ""
    key_name: str = HTTP_KEY
    # The key the effect is held under: the agent's own (Idempotency-Key, MCP _meta),
    # for the journal; for a call sent without one, the key derived from its content
    # (`content_key`) once `keyed_by_content` chose its generation.
    agent_key: str = ""
    # A call without a key of its own on a route that keys such calls by their content:
    # the content's id, from which `keyed_by_content` derives the hold (hold_id '' till then).
    content: str = ""
    # Priced while its route's stress detector was on (pipeline/reserve.py's `under_stress`).
    stressed: bool = False
    # Held at its stressed price while the detector was off, in the detector's run
    # `stress_run`: lowered to `calm_price` once the detector vouches for it (0: no margin).
    calm_price: int = 0
    stress_run: int = 0


def agent_key_of(keys: Sequence[str], key_name: str = HTTP_KEY) -> str:
    """The agent's one idempotency key for an effect; `key_name` says where it is sent."""
    if len(keys) > 1:
        # Which one names the effect? Intermediaries disagree (first, last, joined).
        raise Problem(400, "bad_idempotency_key", f"send exactly one {key_name}")
    if not keys:
        raise Problem(
            400,
            "idempotency_key_required",
            f"effects need an idempotency key ({key_name}): the same key for every retry of "
            "one effect, a new key for a new effect",
        )
    if not _AGENT_KEY.fullmatch(keys[0]):
        raise Problem(400, "bad_idempotency_key", f"{key_name} must be 1-255 printable ASCII")
    return keys[0]


def prepare(
    policy: TenantPolicy, agent: AuthenticatedAgent, intent: Intent, *, in_process: bool
) -> Prepared:
    """Price the effect, check the agent may make it here (`in_process`: through the
    decision API, else the proxy) and at this price, and derive the request its hold
    keeps, the hold's id and the fingerprint that tells a repeat from a new effect."""
    check_active(agent)
    effect = _priced(policy, intent)
    check_route_scope(policy, agent, effect)
    _check_door(effect, in_process)
    shadow = is_shadow(policy, effect)
    cap_refusal = ""
    try:
        check_per_effect_cap(agent, effect)
    except PerEffectCapExceeded as exc:
        if not shadow:
            raise cap_problem(policy, exc) from exc
        cap_refusal = exc.reason
    request = _stored_request(agent, intent, effect)
    if effect.effect_class is EffectClass.READ and not in_process:
        return Prepared(
            effect=effect, request=request, hold_id="", fingerprint="", key_name=intent.key_name
        )
    effect_headers = tuple(h for h in intent.headers if h[0] not in TRACE_HEADERS)
    body = intent.canonical.fingerprint_body
    digest = fingerprint(intent.operation, intent.target, request.query, body, effect_headers)
    route = effect.route
    key_name = intent.key_name
    if intent.keys or in_process or route is None or not route.keyless:
        agent_key = agent_key_of(intent.keys, intent.key_name)
    elif route.dedupe_window_ms == 0:
        # The route's identical calls are meant to repeat: each is an effect of its own.
        agent_key = KEYLESS_KEY_PREFIX + secrets.token_hex(16)
        key_name = intent.keyless_name
        request = replace(request, alone=True)
    else:
        content = hold_id_for(policy.tenant, agent.agent_id, effect.route_id, content_key(digest))
        return Prepared(
            effect=effect,
            request=request,
            hold_id="",
            fingerprint=digest,
            shadow=shadow,
            cap_refusal=cap_refusal,
            key_name=intent.keyless_name,
            content=content,
        )
    hold_id = hold_id_for(policy.tenant, agent.agent_id, effect.hold_route, agent_key)
    return Prepared(
        effect=effect,
        request=request,
        hold_id=hold_id,
        fingerprint=digest,
        shadow=shadow,
        cap_refusal=cap_refusal,
        key_name=key_name,
        agent_key=agent_key,
    )


def check_active(agent: AuthenticatedAgent) -> None:
    """403 agent_suspended for an agent an operator suspended: first, before its call
    is priced, so that nothing about the call (a route it may not use, a bad body)
    tells it more than that it is stopped, and why."""
    suspension = agent.suspended
    if suspension is None:
        return
    raise Problem(
        403,
        "agent_suspended",
        f"an operator ({suspension.by}) suspended agent {agent.agent_id} at "
        f"{suspension.at}, saying {suspension.reason!r}; none of its calls is made "
        "until an operator resumes it",
        **suspension_members(suspension),
    )


def _priced(policy: TenantPolicy, intent: Intent) -> PricedEffect:
    canonical = intent.canonical
    with tracing.span(
        "price", tenant=policy.tenant, tool=intent.tool, method=intent.operation
    ) as span:
        effect = price_request(
            policy,
            intent.tool,
            intent.operation,
            intent.target,
            canonical.query_map,
            canonical.document,
            canonical.body_format,
        )
        tracing.annotate(
            span, route=effect.route_id, price=effect.price_micros, effect=effect.effect_class
        )
    return effect


def _check_door(effect: PricedEffect, in_process: bool) -> None:
    """A decision-only route is reached through /v1/holds, any other through the proxy."""
    if effect.in_process and not in_process:
        raise Problem(403, "in_process_route", "this route is decision-only: use /v1/holds")
    if in_process and not effect.in_process:
        raise Problem(403, "route_is_proxied", "this route's effects go through /tools/...")


def _stored_request(
    agent: AuthenticatedAgent, intent: Intent, effect: PricedEffect
) -> StoredRequest:
    """What goes upstream, re-encoded from what was priced, never the agent's bytes."""
    canonical = intent.canonical
    return StoredRequest(
        agent=agent.agent_id,
        tool=intent.tool,
        method=intent.operation,
        path=intent.target,
        query=canonical.query_text,
        content_type=canonical.content_type,
        body_b64=base64.b64encode(canonical.body).decode(),
        route_id=effect.route_id,
        price=effect.price_micros,
        headers=intent.headers,
        face_value=effect.face_value_micros,
        effect_class=effect.effect_class.value,
        in_process=effect.in_process,
    )


def read_paced(policy: TenantPolicy, agent: AuthenticatedAgent) -> list[str]:
    """The accounts whose read rate a read of `agent` counts against (its own, its
    principal's): none, and no Redis call, where the policy sets no read rate."""
    paced = []
    for account in (f"agent:{agent.agent_id}", f"principal:{agent.principal_id}"):
        spec = policy_account(policy, account)
        if spec is not None and spec.rates is not None and spec.rates.reads is not None:
            paced.append(account)
    return paced


def content_key(digest: str, generation: int = 0) -> str:
    """The key a call sent without one is held under: its content's digest (what
    `fingerprint` reads: method, path, query, body and passed headers, as priced) and
    the generation of that content's holds (lua/attach.lua); with no generation, the
    content's own id. A client that later sends this key itself reaches the same hold."""
    return f"{CONTENT_KEY_PREFIX}{digest}" + (f"-{generation}" if generation else "")


async def keyed_by_content(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> Prepared:
    """A keyless call's hold: its content's newest, while that is live (escalated, in
    flight, ambiguous) or settled within the route's dedupe window, so that a repeat
    (a model told its call waits for a human, a host that retries) attaches to the
    same escalation and result; else a new generation's (docs/policy.md, "Calls
    without a key")."""
    route = prepared.effect.route
    assert route is not None  # prepare keys only listed routes' calls by content
    tenant, route_id = policy.tenant, prepared.effect.route_id

    def hold_of(generation: int) -> str:
        key = content_key(prepared.fingerprint, generation)
        return hold_id_for(tenant, agent.agent_id, route_id, key)

    # The index outlives every hold it can point at: a settled one's record lives its
    # retention after it ended, which is at most the hold's and its escalation's
    # lives after the call that opened it.
    keep_ms = min(
        gate.settings.retention_s * 1000
        + policy.escalation_ttl_ms
        + policy.hold_ttl_ms
        + route.dedupe_window_ms,
        MAX_CONTENT_KEEP_MS,
    )
    attached = await gate.ledger.attach(
        tenant, prepared.content, hold_of, window_ms=route.dedupe_window_ms, keep_ms=keep_ms
    )
    key = content_key(prepared.fingerprint, attached.generation)
    return replace(prepared, hold_id=attached.hold_id, agent_key=key)


def target_of(gate: Gate, policy: TenantPolicy, tool_name: str) -> HttpTarget:
    target = gate.tenants.target(policy.tenant, tool_name)
    if target is None:
        raise Problem(403, "no_upstream", f"tool {tool_name!r} has no upstream to forward to")
    return target


def upstream_of(gate: Gate, policy: TenantPolicy, tool_name: str) -> Upstream:
    """The tool's upstream: its MCP server (gateway/state/mcp_upstream.py) or its HTTP API;
    403 if it has neither."""
    mcp = gate.tenants.mcp_upstream(policy.tenant, tool_name)
    if mcp is not None:
        return mcp
    slots = UpstreamSlots(
        gate.tenant_slots(policy.tenant), gate.settings.upstream_connect_timeout_s
    )
    return HttpUpstream(gate.http, target_of(gate, policy, tool_name), slots=slots)


def cap_problem(policy: TenantPolicy, exc: PerEffectCapExceeded) -> Problem:
    """The 403 of an effect above its agent's per-effect cap (on its face value)."""
    units = units_of(policy)
    return Problem(
        403,
        exc.reason,
        f"This call's amount, {units.money(exc.face_value_micros)}, is above this agent's "
        f"cap of {units.money(exc.cap_micros)} for one effect",
        **amounts_in_currency(policy, face_value=exc.face_value_micros, cap=exc.cap_micros),
    )
