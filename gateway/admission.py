"""The one admission pipeline, for the proxy, approvals and the decision API:
prepare (price, check, derive the hold) -> reserve (one ledger round trip) -> fire
(deliver through an `Upstream`) -> settle (the hold by what the upstream said).
Arithmetic lives in pricing/, state changes in ledger/, delivery behind `Upstream`;
this module only orders them. Routers parse requests into an `Intent` and shape
what comes back; nothing here sees an HTTP request."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import httpx

from ledger import (
    RULE_PREFIX,
    Hold,
    HoldInFlight,
    HoldState,
    HoldStateConflict,
    Ledger,
    LedgerUnavailable,
    OpenPool,
    PoolShrank,
    PoolTicket,
    Provenance,
    Reason,
    ReserveResult,
    Rule,
    TransitionResult,
    UnknownAccount,
    pool_tag,
)
from pricing import (
    AuthenticatedAgent,
    EffectClass,
    PerEffectCapExceeded,
    PricedEffect,
    TenantPolicy,
    check_per_effect_cap,
    check_route_scope,
    hold_accounts,
    is_shadow,
    policy_account,
    pooled_pending,
    price_request,
    priced_for,
    rfc3339,
    shadow_hold,
)

from . import metrics, tracing
from .advice import budget_refusal, next_window, rejection, units_of
from .canonical import Canonical
from .crashpoints import crash_point
from .http_upstream import HTTP_KEY, HttpTarget, HttpUpstream, UpstreamSlots
from .in_flight import AgentSlots
from .policies import ledger_account
from .problems import PROBLEM_JSON, Problem
from .refusals import RefusalTally
from .resettle import Resettler
from .responses import Shadowed, amounts_in_currency
from .settings import GatewaySettings
from .tenants import TenantStore, factor_accounts
from .upstream import Answer, Fate, Upstream
from .wire import Headers, StoredAnswer, StoredRequest, fingerprint, hold_id_for

log = logging.getLogger("irrev.gateway")
# A trace context is new on every attempt by design; it does not change the effect.
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_AGENT_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# The longest a keyless content's index is kept after its last use (ledger/validate.py's
# bound on a TTL).
MAX_CONTENT_KEEP_MS = 366 * 24 * 3600 * 1000
CONTENT_KEY_PREFIX = "content-"
# Intent.keyless_name of an HTTP request and of an MCP call.
KEYLESS_REQUEST = "request"
KEYLESS_ARGUMENTS = "arguments"
KEYLESS_NAMES = frozenset({KEYLESS_REQUEST, KEYLESS_ARGUMENTS})


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
    # This process's refusals since their last flush to Redis (gateway/refusals.py).
    refusals: RefusalTally = field(default_factory=RefusalTally)
    # Settlements the ledger could not take when their fate was known.
    resettle: Resettler = field(default_factory=Resettler)

    def tenant_slots(self, tenant: str) -> asyncio.Semaphore:
        if tenant not in self.slots:
            self.slots[tenant] = asyncio.Semaphore(self.settings.tenant_connections())
        return self.slots[tenant]


@dataclass(frozen=True, kw_only=True)
class Intent:
    """An effect as an agent asked for it, parsed by its router: `path` starts with
    '/'; `canonical` is the query and body as they are priced and forwarded;
    `headers` are the agent's headers its tool lets through (lower-case names,
    sorted); `keys` are the idempotency keys the agent sent (anything held needs
    exactly one)."""

    tool: str
    method: str
    path: str
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


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """What became of a held effect: `answer` is None while a human decides
    (escalated), a StoredAnswer when a repeat of the key gets the recorded answer
    back, else what the upstream answered now. `shadowed`: a would-be deny or
    escalation that shadow mode forwarded anyway."""

    result: ReserveResult
    hold_id: str
    answer: Answer | StoredAnswer | None
    shadowed: Shadowed | None = None
    key: str = ""  # the key it is held under (Prepared.agent_key)
    # A repeat of an escalated effect's key: who approved it and why, for the agent.
    by: str = ""
    note: str = ""


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
    canonical = intent.canonical
    with tracing.span(
        "price", tenant=policy.tenant, tool=intent.tool, method=intent.method
    ) as span:
        effect = price_request(
            policy,
            intent.tool,
            intent.method,
            intent.path,
            canonical.query_map,
            canonical.document,
            canonical.body_format,
        )
        tracing.annotate(
            span, route=effect.route_id, price=effect.price_micros, effect=effect.effect_class
        )
    check_route_scope(policy, agent, effect)
    if effect.in_process and not in_process:
        raise Problem(403, "in_process_route", "this route is decision-only: use /v1/holds")
    if in_process and not effect.in_process:
        raise Problem(403, "route_is_proxied", "this route's effects go through /tools/...")
    shadow = is_shadow(policy, effect)
    cap_refusal = ""
    try:
        check_per_effect_cap(agent, effect)
    except PerEffectCapExceeded as exc:
        if not shadow:
            raise cap_problem(policy, exc) from exc
        cap_refusal = exc.reason
    # What goes upstream is re-encoded from what was priced, never the agent's bytes.
    body = canonical.body
    request = StoredRequest(
        agent=agent.agent_id,
        tool=intent.tool,
        method=intent.method,
        path=intent.path,
        query=canonical.query_text,
        content_type=canonical.content_type,
        body_b64=base64.b64encode(body).decode(),
        route_id=effect.route_id,
        price=effect.price_micros,
        headers=intent.headers,
        face_value=effect.face_value_micros,
        effect_class=effect.effect_class.value,
        in_process=effect.in_process,
    )
    if effect.effect_class is EffectClass.READ and not in_process:
        return Prepared(
            effect=effect, request=request, hold_id="", fingerprint="", key_name=intent.key_name
        )
    effect_headers = tuple(h for h in intent.headers if h[0] not in TRACE_HEADERS)
    digest = fingerprint(intent.method, intent.path, request.query, body, effect_headers)
    route = effect.route
    if intent.keys or in_process or route is None or not route.keyless:
        agent_key = agent_key_of(intent.keys, intent.key_name)
    elif route.dedupe_window_ms == 0:
        # The route's identical calls are meant to repeat: each is an effect of its own.
        agent_key = "keyless-" + secrets.token_hex(16)
    else:
        content = hold_id_for(policy.tenant, agent.agent_id, effect.route_id, content_key(digest))
        name = intent.keyless_name
        return Prepared(
            effect=effect,
            request=request,
            hold_id="",
            fingerprint=digest,
            shadow=shadow,
            cap_refusal=cap_refusal,
            key_name=name,
            content=content,
        )
    hold_id = hold_id_for(policy.tenant, agent.agent_id, effect.route_id, agent_key)
    return Prepared(
        effect=effect,
        request=request,
        hold_id=hold_id,
        fingerprint=digest,
        shadow=shadow,
        cap_refusal=cap_refusal,
        key_name=intent.key_name,
        agent_key=agent_key,
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
    """The tool's upstream: its MCP server (gateway/mcp_upstream.py) or its HTTP API;
    403 if it has neither."""
    mcp = gate.tenants.mcp_upstream(policy.tenant, tool_name)
    if mcp is not None:
        return mcp
    slots = UpstreamSlots(
        gate.tenant_slots(policy.tenant), gate.settings.upstream_connect_timeout_s
    )
    return HttpUpstream(gate.http, target_of(gate, policy, tool_name), slots=slots)


async def admit(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    upstream: Upstream,
) -> Admitted | Answer:
    """The proxy's path: a read goes straight through (its bare Answer); an effect is
    reserved, then fired and settled, or escalated to a human; a repeat of its key
    gets the recorded answer or, for an ambiguous hold, the same effect again under
    the same key."""
    if not prepared.content:
        return await _admit(gate, policy, agent, prepared, upstream)
    prepared = await keyed_by_content(gate, policy, agent, prepared)
    try:
        return await _admit(gate, policy, agent, prepared, upstream)
    except Problem as problem:
        # The key its content gave it, which the agent never sent: a client that can
        # send keys may repeat the call with it.
        problem.extra.setdefault("idempotency_key", prepared.agent_key)
        raise


async def _admit(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    upstream: Upstream,
) -> Admitted | Answer:
    hold_id, key = prepared.hold_id, prepared.agent_key
    if not hold_id:
        paced = read_paced(policy, agent)
        if paced:
            await gate.ledger.pace_reads(policy.tenant, paced)
        return await upstream.deliver(prepared.request, "", _answer_by(gate))
    sent = time.monotonic()
    result, prepared, ticket = await reserve_priced(gate, policy, agent, prepared)
    if result.state is HoldState.ESCALATED:
        alone = ticket.alone if ticket is not None and ticket.alone is not None else 0
        rule = await auto_approval(gate, policy, agent, result, alone)
        if rule is None:
            return Admitted(result=result, hold_id=hold_id, answer=None, key=key)
        note = f"approved automatically by rule {rule.rule_id}"
        try:
            answer = await approve(gate, policy, hold_id, RULE_PREFIX + rule.rule_id, note)
        except Problem as lost:
            if lost.reason != "escalation_resolved":
                raise
            # A person (or the sweeper) was first.
            return Admitted(result=result, hold_id=hold_id, answer=None, key=key)
        if answer is not None:
            return Admitted(result=result, hold_id=hold_id, answer=answer, key=key)
        return Admitted(result=result, hold_id=hold_id, answer=None, key=key)
    if not result.replayed:
        # The hold's life as Redis counts it (deadline - its creation, both Redis
        # time), measured from before the reserve was sent: never later than the
        # deadline, whatever this host's wall clock says.
        expires_at = sent + (result.deadline_ms - result.created_ms) / 1000
        answer = await fire(gate, policy, hold_id, prepared.request, expires_at, upstream)
        return Admitted(
            result=result,
            hold_id=hold_id,
            answer=answer,
            shadowed=shadowed(prepared, result),
            key=key,
        )
    replayed, hold = await _replay(gate, policy, result, prepared, upstream)
    by, note = (hold.by, hold.note) if hold is not None else ("", "")
    return Admitted(result=result, hold_id=hold_id, answer=replayed, key=key, by=by, note=note)


def shadowed(prepared: Prepared, result: ReserveResult) -> Shadowed | None:
    """What enforcement would have done with a new decision that shadow mode held
    anyway: the per-effect cap's refusal first (it is checked before the ledger),
    else the ledger's deny or escalation; None when enforcement would have admitted."""
    if result.replayed:
        return None
    if prepared.cap_refusal:
        return Shadowed("deny", prepared.cap_refusal)
    if result.shadowed:
        return Shadowed(result.decision.value, result.reason.value)
    return None


async def _replay(
    gate: Gate, policy: TenantPolicy, result: ReserveResult, prepared: Prepared, upstream: Upstream
) -> tuple[Answer | StoredAnswer, Hold | None]:
    """The answer to a repeat of a key, and the hold as it was read (who approved it
    and why reach the agent beside the answer)."""
    hold_id, key_name = prepared.hold_id, prepared.key_name
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is not None and hold.state is HoldState.AMBIGUOUS and hold.request:
        if not upstream.resends:
            # Its server may not deduplicate: sent again, the effect could happen twice.
            # The agent learns what the ledger knows; the reconciler resolves the rest.
            raise still_ambiguous(hold_id, key_name)
        # The first outcome is unknown: retry, with the same Idempotency-Key, so the
        # tool API can deduplicate it (contract 4). One retry at a time (the claim).
        request = StoredRequest.loads(hold.request)
        try:
            return await fire(gate, policy, hold_id, request, None, upstream, key_name), hold
        except HoldStateConflict:
            # Settled between the read and the claim (another retry, the reconciler).
            hold = await gate.ledger.hold(policy.tenant, hold_id)
    return _recorded(hold, result, hold_id, key_name), hold


def _recorded(
    hold: Hold | None, result: ReserveResult, hold_id: str, key_name: str
) -> StoredAnswer:
    """The answer a settled hold keeps for repeats of its key; else the problem its
    state is."""
    if hold is not None and hold.outcome:
        recorded = StoredAnswer.loads(hold.outcome)
        if hold.state is HoldState.VOIDED and recorded.status // 100 == 2:
            # An upstream 2xx never voids: this is the receipt of a void through the
            # holds API, not an answer to give back as the effect's.
            raise Problem(
                409,
                "hold_voided",
                f"this effect's hold was voided, so it was not made; use a new {key_name} "
                "to make it",
                hold=hold_id,
                state=hold.state.value,
            )
        return recorded
    if hold is not None and hold.state is HoldState.AMBIGUOUS:
        raise still_ambiguous(hold_id, key_name)
    raise settled_problem(hold.state if hold else result.state, hold_id, hold)


def still_ambiguous(hold_id: str, key_name: str) -> Problem:
    return Problem(
        502,
        "upstream_ambiguous",
        "whether this effect was made is still unknown; it was not sent again (its server "
        "does not declare that it deduplicates) and stays charged until the reconciler "
        f"learns the outcome. Repeat it later with the same {key_name} for the result",
        hold=hold_id,
        state=HoldState.AMBIGUOUS.value,
    )


async def reserve(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> ReserveResult:
    """One round trip; a denial is raised (403 with the numbers that decided it). A
    risk-factor account met for the first time is opened by the reserve itself, only
    if it keeps the hold; an account the policy names but Redis lost by writing it
    with the rest its tenant lacks (`TenantStore.open_missing`), then the reserve is
    repeated once; and a calibrating route's effect priced for more holds than are
    open (`reserve_priced`)."""
    result, _, _ = await reserve_priced(gate, policy, agent, prepared)
    return result


# Times a calibrating route's reserve is priced again for the open set the ledger
# answered with before it is priced for a hold alone (which the ledger never sends
# back): under churn the set may shrink again between the answer and the next try.
# One the ledger says would escalate is priced alone at once (PoolShrank.alone).
POOL_TRIES = 2


def _pooled(
    tenants: TenantStore, policy: TenantPolicy, prepared: Prepared, alone: bool
) -> tuple[Prepared, PoolTicket]:
    """A calibrating route's effect priced for its route's holds open across the
    fleet, as this process last saw them (`pooled_pending`), or for itself `alone`;
    and the ticket that makes the ledger count it in, and keep it only while the set
    is as large as its price assumed."""
    effect = prepared.effect
    face = effect.face_value_micros
    seen = tenants.pools.get((policy.tenant, effect.route_id), OpenPool())
    pending = 1.0 if alone else pooled_pending(seen.effective(face))
    priced = priced_for(effect, pending)
    request = replace(prepared.request, price=priced.price_micros)
    held = replace(prepared, effect=priced, request=request)
    # The approval thresholds compare the price alone: an agent can open holds to
    # pool over, and must not price its way under a threshold with them.
    solo = priced_for(effect, 1.0).price_micros
    return held, PoolTicket(pool_tag(effect.route_id), face, pending, solo)


async def reserve_priced(
    gate: Gate, policy: TenantPolicy, agent: AuthenticatedAgent, prepared: Prepared
) -> tuple[ReserveResult, Prepared, PoolTicket | None]:
    """`reserve`, the effect as it was held and, for a calibrating route, the ticket
    it was held with (its price alone included): an effect of a calibrating route is
    priced for its route's holds open at once across the fleet (pricing/calibration.py,
    as the simulator prices it), which only its reserve can tell for sure: one that
    finds fewer open than its price assumed is sent back, priced again for the set
    the ledger saw and sent once more (`POOL_TRIES`, then priced for a hold alone).
    One that would escalate is sent back to be priced alone: an escalated hold waits
    outside the set and joins the one open when it is approved, however small."""
    hold_id = prepared.hold_id
    route = prepared.effect.route
    # A decision-only route's hold (/v1/holds) is one its agent may void itself at
    # no cost, so it would pad the open set that every other hold pools over: it is
    # priced alone and not counted (docs/policy.md, calibrate).
    pooling = route.pooling if route and not prepared.effect.in_process else None
    pool_key = (policy.tenant, prepared.effect.route_id)
    ticket: PoolTicket | None = None

    async def attempt() -> ReserveResult:
        effect = prepared.effect
        amounts = hold_accounts(policy, agent, effect)
        if prepared.shadow:
            # Decided and held on the accounts' shadow twins: a shadow route's effect,
            # whatever it costs, never takes room an enforced one needs.
            amounts, shadows = shadow_hold(policy, amounts)
            opens = [ledger_account(spec) for spec in shadows]
        else:
            opens = factor_accounts(policy, amounts)
        started = time.perf_counter()
        try:
            return await gate.ledger.reserve(
                policy.tenant,
                hold_id,
                prepared.fingerprint,
                amounts,
                ttl_ms=policy.hold_ttl_ms,
                escalation_ttl_ms=policy.escalation_ttl_ms,
                escalate_above=effect.approval_threshold_micros or 0,
                request=prepared.request.dumps(),
                open_missing=opens,
                shadow=prepared.shadow,
                pool=ticket,
                # What the journal keeps of who asked and what was sent (issue 14).
                provenance=Provenance(
                    route=effect.route_id,
                    agent=agent.agent_id,
                    principal=agent.principal_id,
                    face_value=effect.face_value_micros,
                    agent_key=prepared.agent_key,
                ),
            )
        finally:
            metrics.LEDGER_SECONDS.labels("reserve").observe(time.perf_counter() - started)

    with tracing.span(
        "reserve", tenant=policy.tenant, agent=agent.agent_id, route=pool_key[1], hold_id=hold_id
    ) as span:
        sent_back = 0
        while True:
            if pooling is not None:
                prepared, ticket = _pooled(gate.tenants, policy, prepared, sent_back == POOL_TRIES)
            try:
                try:
                    result = await attempt()
                except UnknownAccount:
                    await gate.tenants.open_missing(gate.ledger, policy.tenant)
                    result = await attempt()
                break
            except PoolShrank as shrank:
                gate.tenants.pools[pool_key] = shrank.pool
                sent_back = POOL_TRIES if shrank.alone else sent_back + 1
        if result.pool is not None:
            gate.tenants.pools[pool_key] = result.pool
        tracing.annotate(
            span,
            price=prepared.effect.price_micros,
            decision=result.decision,
            reason=result.reason,
            replayed=result.replayed,
        )
    effect = prepared.effect
    if not result.replayed:
        would = shadowed(prepared, result)
        decision = would.decision if would else result.decision.value
        reason = would.reason if would else result.reason.value
        mode = "shadow" if prepared.shadow else "enforce"
        metrics.DECISIONS.labels(policy.tenant, decision, reason, mode).inc()
        metrics.PRICES.labels(policy.tenant).observe(effect.price_micros)
        log.info(
            "shadow decision" if would else "decision",
            extra={
                "tenant": policy.tenant,
                "agent": agent.agent_id,
                "route": effect.route_id,
                "decision": decision,
                "reason": reason,
                "mode": mode,
                "price": effect.price_micros,
                "hold_id": hold_id,
                "state": result.state.value,
            },
        )
        if result.state is HoldState.PENDING:
            await require_replicas(
                gate,
                policy.tenant,
                hold_id,
                result.replicas,
                agent.agent_id,
                prepared.key_name,
                result.fsynced,
            )
            crash_point("after_reserve")
    if result.reason is Reason.ESCALATION_CAP:
        raise escalations_waiting(policy, agent, hold_id)
    if result.reason is Reason.ACCOUNT_CAP:
        raise accounts_opened(policy, agent, result)
    if result.state is HoldState.DENIED:
        raise refusal(policy, result, hold_id, effect.face_value_micros)
    return result, prepared, ticket


async def approve(
    gate: Gate, policy: TenantPolicy, hold_id: str, admin: str, note: str = ""
) -> Answer | None:
    """Consume-once: of any number of concurrent approvals exactly one claims the
    hold and forwards its effect, by the deadline and request the claim returns;
    every other gets 409 naming the outcome and who decided it. None: the route is
    decision-only, and its in-process tool sees the hold pending and acts itself."""
    tenant = policy.tenant
    with tracing.span("approval", tenant=tenant, hold_id=hold_id, admin=admin) as span:
        # Where the effect goes is looked up before the claim: a policy that dropped
        # the tool's upstream meanwhile is refused while the hold is still escalated,
        # not after, when a claimed hold nobody can send would turn ambiguous.
        upstream = await _approval_upstream(gate, policy, hold_id)
        sent = time.monotonic()
        try:
            claim = await gate.ledger.approve(
                tenant, hold_id, admin, ttl_ms=policy.hold_ttl_ms, note=note
            )
        except HoldStateConflict as exc:
            tracing.annotate(span, decision="conflict", state=exc.state.value)
            raise resolved_already(exc) from exc
        crash_point("after_claim")
        request = StoredRequest.loads(claim.request)
        tracing.annotate(span, decision="approved", price=request.price, route=request.route_id)
        resolved(tenant, admin, "approved", hold_id, request, note)
        # Kept for the agent's repeat of its call: worded for where it sends its key.
        key_name = upstream.key_name if upstream is not None else HTTP_KEY
        await require_replicas(
            gate, tenant, hold_id, claim.replicas, request.agent, key_name, claim.fsynced
        )
        if upstream is None:
            return None
        # The claim armed the hold for ttl_ms from its Redis time, after `sent`.
        expires_at = sent + policy.hold_ttl_ms / 1000
        return await fire(gate, policy, hold_id, request, expires_at, upstream)


async def auto_approval(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    result: ReserveResult,
    alone: int = 0,
) -> Rule | None:
    """The live rule, if any, that approves this new escalation without a person: an
    `auto_approve` rule for its agent or its agent's principal whose `max_price` the
    price is within. Rules are read only for escalations, and against the reserve's
    own clock (Redis's), so an expired rule never approves. `alone`: a pooled effect's
    price alone, which `max_price` compares, as the thresholds do (reserve.lua)."""
    if result.replayed:
        return None
    price = max(result.price, alone)
    for rule in await gate.ledger.rules(policy.tenant, result.created_ms):
        spec = json.loads(rule.spec)
        mine = spec.get("agent") == agent.agent_id or spec.get("principal") == agent.principal_id
        if spec.get("kind") == "auto_approve" and mine and price <= spec["max_price"]:
            return rule
    return None


async def _approval_upstream(gate: Gate, policy: TenantPolicy, hold_id: str) -> Upstream | None:
    """The upstream an escalated hold's effect goes to once approved; None for a
    decision-only route (its in-process tool acts itself) and for a hold that is not
    escalated (the claim then says what became of it)."""
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is None or hold.state is not HoldState.ESCALATED or not hold.request:
        return None
    request = StoredRequest.loads(hold.request)
    found = policy.catalog.match(request.tool, request.method, request.path)
    if found is not None and found[0].in_process:
        return None
    return upstream_of(gate, policy, request.tool)


def resolved(
    tenant: str,
    admin: str,
    decision: str,
    hold_id: str,
    request: StoredRequest | StoredAnswer | None,
    reason: str = "",
) -> None:
    """The counter and the log line of an approval, a rejection or a resolution by
    hand, with the admin's reason (the one the agent and the journal get)."""
    metrics.ADMIN_DECISIONS.labels(tenant, metrics.admin_label(admin), decision).inc()
    log.info(
        f"escalation {decision}",
        extra={
            "tenant": tenant,
            "admin": admin,
            "hold_id": hold_id,
            "agent": request.agent if request else None,
            "route": request.route_id if request else None,
            "price": request.price if isinstance(request, StoredRequest) else None,
            "reason": reason or None,
        },
    )


async def require_replicas(
    gate: Gate,
    tenant: str,
    hold_id: str,
    acknowledged: int | None,
    agent_id: str,
    key_name: str = HTTP_KEY,
    fsynced: int | None = None,
) -> None:
    """Fail closed when the primary did not fsync an admission to its AOF in time
    (IRREV_WAIT_AOF=local, WAITAOF's first count), or fewer replicas than
    IRREV_WAIT_REPLICAS acknowledged it: a crash or a failover could lose it while
    its effect happened. Nothing has been sent, so the hold is released, with this
    answer kept for a repeat of the key. (A wait that answered an error counts as
    short: the ledger says so, as the write was made.)"""
    released = "it was released and nothing was sent. " + (
        "Repeat it: an identical call is decided anew"
        if key_name in KEYLESS_NAMES
        else f"Retry with a new {key_name}"
    )
    problem = unacknowledged(gate, hold_id, acknowledged, fsynced, "the admission", released)
    if problem is None:
        return
    body = bytes(problem.response().body)
    answer = StoredAnswer.of(
        agent_id, 503, [("content-type", PROBLEM_JSON)], body, reason=problem.reason
    )
    await gate.ledger.void(tenant, hold_id, outcome=answer.dumps())
    metrics.DECISIONS.labels(tenant, "released", problem.reason, "enforce").inc()
    raise problem


def unacknowledged(
    gate: Gate,
    hold_id: str,
    acknowledged: int | None,
    fsynced: int | None,
    write: str,
    then: str,
) -> Problem | None:
    """The 503 of a `write` that the primary did not fsync (WAITAOF's first count 0)
    or fewer replicas than IRREV_WAIT_REPLICAS acknowledged in time, saying `then`
    (what became of the hold); None when it was acknowledged as asked."""
    wanted = gate.settings.wait_replicas
    timeout = gate.settings.wait_timeout_ms
    if fsynced == 0:
        return Problem(
            503,
            "not_fsynced",
            f"Redis had not fsynced {write} to its append-only file within {timeout} ms, "
            f"so a crash could lose it; {then}.",
            headers={"Retry-After": "1"},
            hold=hold_id,
        )
    if acknowledged is not None and acknowledged < wanted:
        return Problem(
            503,
            "not_replicated",
            f"{write} reached {acknowledged} of {wanted} Redis replicas within {timeout} ms, "
            f"so a failover could lose it; {then}.",
            headers={"Retry-After": "1"},
            hold=hold_id,
            replicas=acknowledged,
            wanted=wanted,
        )
    return None


def _answer_by(gate: Gate) -> float:
    """The monotonic instant an upstream must have answered by (`Upstream.deliver`)."""
    return time.monotonic() + gate.settings.upstream_timeout_s


async def fire(
    gate: Gate,
    policy: TenantPolicy,
    hold_id: str,
    request: StoredRequest,
    expires_at: float | None,
    upstream: Upstream,
    key_name: str = HTTP_KEY,
) -> Answer:
    """Deliver an admitted effect once and settle its hold by the answer.
    `expires_at` is the monotonic instant by which the hold's deadline (Redis's
    clock) may have passed, None for the retry of an ambiguous hold, which never
    expires. No wall clock is read: a host whose clock is off by seconds must not
    forward a hold whose deadline a reconciler elsewhere already sees passed."""
    budget_s = (expires_at or 0.0) - time.monotonic() - gate.settings.forward_margin_s
    claim = ""
    # The instant the upstream must have answered by, taken before anything is
    # awaited: a worker that stalls after its checks (a busy event loop, a GC pause)
    # shortens the send and cannot push its end past what the checks allowed.
    answer_by = _answer_by(gate)
    if expires_at is not None and budget_s < gate.settings.upstream_timeout_s:
        # Too close to the deadline: the answer could come after the hold turned
        # ambiguous. Not sent, so provably not fired: release it.
        await gate.ledger.void(policy.tenant, hold_id)
        raise Problem(503, "hold_deadline", "the hold is too close to its deadline to forward")
    if expires_at is None:
        # Sent again: first claimed, so that of any number of repeats of the key one is
        # sent at a time, and the hold's deadline moves past this request's life, so a
        # reconciler told "not found" while it is on its way cannot void it (contract 6).
        # The claim's window starts at Redis's time of the claim, after `answer_by` was
        # taken: the send ends at least the margin before the claim lapses, however late
        # the claim's reply is read.
        window_s = gate.settings.upstream_timeout_s + gate.settings.forward_margin_s
        try:
            claimed = await gate.ledger.retry(policy.tenant, hold_id, math.ceil(window_s * 1000))
            claim = claimed.claim
        except HoldInFlight as exc:
            raise Problem(
                409,
                "in_flight",
                "this effect is being sent again by another repeat of its key right now; "
                f"ask again in a moment with the same {key_name}",
                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_ms / 1000)))},
                hold=hold_id,
                state=HoldState.AMBIGUOUS.value,
            ) from exc
        await _require_claim_kept(gate, policy.tenant, hold_id, claimed, key_name)
    started = time.perf_counter()
    retry = expires_at is None
    with tracing.span("forward", tool=request.tool, hold_id=hold_id, retry=retry) as span:
        if retry and time.monotonic() >= answer_by:
            # The claim's reply came too late to send at all: a request begun now
            # could still be on its way once the claim lapsed.
            answer = Answer(fate=Fate.NOT_SENT, why="upstream_timeout")
        else:
            answer = await upstream.deliver(request, hold_id, answer_by, retry=retry)
        tracing.annotate(span, fate=answer.fate.value, status=answer.status or None)
    elapsed_s = time.perf_counter() - started
    if answer.fate is Fate.DELIVERED:
        crash_point("after_upstream_2xx")
    metrics.UPSTREAM_SECONDS.labels(request.tool).observe(elapsed_s)
    metrics.UPSTREAM_OUTCOMES.labels(request.tool, answer.fate).inc()
    if retry and answer.fate in (Fate.NOT_SENT, Fate.REFUSED):
        answer = unproven_retry(answer)
    await settle(gate, policy.tenant, hold_id, request, answer, claim)
    return answer


async def _require_claim_kept(
    gate: Gate, tenant: str, hold_id: str, claimed: TransitionResult, key_name: str
) -> None:
    """A retry's claim is waited for as an admission is (IRREV_WAIT_REPLICAS,
    IRREV_WAIT_AOF), and its wait counts the hold's reserve written before it: short,
    a failover or a crash could lose the charge of an effect sent now, so it is not
    sent (contract 4). Unlike a short admission the hold is not released: its first
    send may have made the effect, so it stays ambiguous and charged, its claim ends
    (the next repeat may claim it again), and the answer is not kept for the key."""
    then = (
        "it was not sent again and stays charged, as its first send may have made it. "
        f"Repeat it later with the same {key_name}"
    )
    problem = unacknowledged(
        gate, hold_id, claimed.replicas, claimed.fsynced, "this effect's charge", then
    )
    if problem is None:
        return
    try:
        await gate.ledger.mark_ambiguous(tenant, hold_id, problem.reason, claimed.claim)
    except Exception:
        log.exception("could not end a retry's claim; it lapses", extra={"hold_id": hold_id})
    raise problem


def unproven_retry(answer: Answer) -> Answer:
    """A retry that was never sent (connection refused, a full pool) or was refused
    (a 429, a 4xx, an MCP 'method not found') says nothing about the first send, which
    may have made the effect: the hold stays ambiguous and charged (its claim ends),
    and the agent is told to repeat the same key later, never to use a new one."""
    return Answer(
        fate=Fate.UNKNOWN,
        status=answer.status,
        headers=answer.headers,
        body=answer.body,
        why=f"retry_{answer.why}",
    )


async def settle(
    gate: Gate, tenant: str, hold_id: str, request: StoredRequest, answer: Answer, claim: str = ""
) -> None:
    """2xx: post at the held price (compensation returns what is recovered later);
    4xx or never sent: void (a first send only: `fire` makes a retry's unknown, see
    `unproven_retry`); in progress: nothing (the hold stays ambiguous and a later retry
    learns the result); anything else: ambiguous, still charged. `claim`: a retry's
    claim (Ledger.retry), which ends when its send ends ambiguous again."""
    if answer.fate is Fate.IN_PROGRESS:
        log.info("still in progress upstream", extra={"hold_id": hold_id, "status": answer.status})
        try:
            # Still ambiguous: this retry's claim ends, so the next repeat may ask again.
            await gate.ledger.mark_ambiguous(tenant, hold_id, "upstream_in_progress", claim)
        except Exception:
            log.exception("could not end a retry's claim; it lapses", extra={"hold_id": hold_id})
        return
    started = time.perf_counter()
    operation = {Fate.DELIVERED: "post", Fate.UNKNOWN: "ambiguous"}.get(answer.fate, "void")
    with tracing.span("settle", tenant=tenant, hold_id=hold_id, operation=operation):
        try:
            write = _settlement(gate, tenant, hold_id, request, answer, claim)
            await write()
        except LedgerUnavailable as exc:
            # Known but not written (Redis away, a slot moving past the wait): written
            # later by this process, so the hold is not left pending for the reconciler.
            log.warning(
                "settlement not written; trying again",
                extra={"hold_id": hold_id, "fate": answer.fate, "cause": exc.cause},
            )
            gate.resettle.later(hold_id, operation, write)
        except Exception:
            # The effect's fate is known but not recorded: the hold stays pending, turns
            # ambiguous at its deadline and the reconciler settles it. Never released.
            log.exception("could not settle hold", extra={"hold_id": hold_id, "fate": answer.fate})
        finally:
            metrics.LEDGER_SECONDS.labels(operation).observe(time.perf_counter() - started)
    log.info(
        "settled",
        extra={"tenant": tenant, "hold_id": hold_id, "fate": answer.fate, "status": answer.status},
    )


def _settlement(
    gate: Gate, tenant: str, hold_id: str, request: StoredRequest, answer: Answer, claim: str
) -> Callable[[], Awaitable[Any]]:
    """The ledger write that records `answer`'s fate (settle), as a call that can be
    made again."""
    if answer.fate is Fate.UNKNOWN:
        return partial(gate.ledger.mark_ambiguous, tenant, hold_id, answer.why, claim)
    status, headers, body, reason = _recordable(answer)
    # The upstream kept only the headers that may reach the agent: all are recorded.
    kept = frozenset(name.lower() for name, _ in headers)
    outcome = request.answer(status, headers, body, keep=kept, reason=reason).dumps()
    if answer.fate is Fate.DELIVERED:
        return partial(gate.ledger.post, tenant, hold_id, request.price, outcome=outcome)
    return partial(gate.ledger.void, tenant, hold_id, outcome=outcome)


def _recordable(answer: Answer) -> tuple[int, list[tuple[str, str]], bytes, str]:
    """Status, headers, body and, for the gateway's own problem, its reason code."""
    if answer.fate is Fate.NOT_SENT:
        reason = "upstream_unreachable"
        body = (
            b'{"reason":"upstream_unreachable","detail":"the tool could not be reached; '
            b'nothing was sent and the hold was released"}'
        )
        return 502, [("content-type", PROBLEM_JSON)], body, reason
    return answer.status, list(answer.headers), answer.body, ""


def resolved_already(conflict: HoldStateConflict) -> Problem:
    """The loser of a consume-once race learns the outcome and who decided it."""
    state = conflict.state.value
    return Problem(409, "escalation_resolved", f"already {state}", state=state, by=conflict.by)


def refusal(policy: TenantPolicy, result: ReserveResult, hold_id: str, face_value: int) -> Problem:
    """The 403 of a denied reserve, with the numbers that decided it: in words for the
    model (what is left, what would fit, when it renews), in minor units for programs."""
    binding = result.binding
    amounts = amounts_in_currency(
        policy, price=result.price, limit=binding.limit, available=binding.available
    )
    return Problem(
        403,
        "budget_exceeded",
        budget_refusal(units_of(policy), result, face_value),
        ledger_reason=result.reason.value,
        hold=hold_id,
        account=binding.account,
        renews_at=rfc3339(next_window(result.created_ms, policy.document.window_ms)),
        **amounts,
    )


def escalations_waiting(policy: TenantPolicy, agent: AuthenticatedAgent, hold_id: str) -> Problem:
    """429 of an effect that would wait for a person while its agent already has as
    many waiting as it may (policy `max_escalations`): nothing was held."""
    spec = policy_account(policy, f"agent:{agent.agent_id}")
    cap = spec.max_escalations if spec is not None else policy.document.max_escalations
    return Problem(
        429,
        "escalation_cap",
        f"This call would wait for a person's approval, but this agent already has {cap} "
        "calls waiting, the most it may have at once; it was not held",
        hold=hold_id,
        max_escalations=cap,
    )


def accounts_opened(
    policy: TenantPolicy, agent: AuthenticatedAgent, result: ReserveResult
) -> Problem:
    """429 of an effect that would open a risk-factor account (a new payee, a new
    supplier) past its agent's max_new_accounts this window: nothing was held."""
    spec = policy_account(policy, f"agent:{agent.agent_id}")
    cap = spec.max_new_accounts if spec is not None else policy.document.max_new_accounts
    return Problem(
        429,
        "account_cap",
        f"This call names a new counterparty (a new risk-factor account), and this agent "
        f"has opened {cap} this budget window, the most it may; it was not held",
        hold=result.hold_id,
        max_new_accounts=cap,
        renews_at=rfc3339(next_window(result.created_ms, policy.document.window_ms)),
    )


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


def rejected_problem(by: str, note: str, hold_id: str | None = None) -> Problem:
    """What the agent learns of a rejection: who, and why in their words."""
    return Problem(
        403, "escalation_rejected", rejection(by, note), by=by, note=note or None, hold=hold_id
    )


def settled_problem(state: HoldState, hold_id: str, hold: Hold | None = None) -> Problem:
    """The answer a hold in `state` gives a repeat of its key when it kept none; a
    rejection names who rejected it and why (from `hold`)."""
    if state is HoldState.REJECTED:
        return rejected_problem(hold.by if hold else "", hold.note if hold else "", hold_id)
    reasons = {
        HoldState.EXPIRED: (403, "hold_expired", "The hold expired before the effect was made"),
        HoldState.PENDING: (409, "in_flight", "This effect is being made right now"),
    }
    status, reason, detail = reasons.get(
        state, (409, "state_conflict", f"the hold is {state.value}")
    )
    headers = {"Retry-After": "1"} if state is HoldState.PENDING else None
    return Problem(status, reason, detail, headers=headers, hold=hold_id, state=state.value)
