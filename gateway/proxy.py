"""`/tools/{tool}/{path}`: the trusted proxy in front of the tenant's tool APIs."""

from __future__ import annotations

import base64
import re
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ledger import Decision, HoldState, ReserveResult
from pricing import EffectClass, PricedEffect, TenantPolicy, check_per_effect_cap, price_request
from pricing.credentials import AuthenticatedAgent
from pricing.scopes import check_route_scope

from .admission import Gate, fire, refusal, reserve, settled_problem, target_of
from .auth import agent_auth, gate_of
from .canonical import Canonical, check_headers, check_raw_path, read_request
from .problems import Problem
from .responses import answer_response, budget_headers, escalated_response, stored_response
from .upstream import forward
from .wire import Headers, StoredAnswer, StoredRequest, fingerprint, hold_id_for

router = APIRouter()
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_AGENT_KEY = re.compile(r"[\x21-\x7e]{1,255}")
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Problem(413, "body_too_large", f"request bodies are limited to {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, "body_too_large", f"request bodies are limited to {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def agent_key_of(request: Request) -> str:
    keys = request.headers.getlist("idempotency-key")
    if len(keys) > 1:
        # Which one names the effect? Intermediaries disagree (first, last, joined).
        raise Problem(400, "bad_idempotency_key", "send exactly one Idempotency-Key header")
    key = keys[0] if keys else None
    if key is None:
        raise Problem(
            400,
            "idempotency_key_required",
            "effects need an 'Idempotency-Key' header: the same key for every retry of one "
            "effect, a new key for a new effect",
        )
    if not _AGENT_KEY.fullmatch(key):
        raise Problem(400, "bad_idempotency_key", "Idempotency-Key must be 1-255 printable ASCII")
    return key


def passed_headers(policy: TenantPolicy, tool: str, request: Request) -> Headers:
    """The agent's headers the tool lets through (names lower-case, sorted by name, in
    their order within a name); everything else it sent stays at the gateway."""
    known = policy.tools.get(tool)
    allowed = known.forwarded if known else frozenset()
    kept = [(name, value) for name, value in request.headers.items() if name in allowed]
    return tuple(sorted(kept, key=lambda header: header[0]))


def price(
    policy: TenantPolicy, tool: str, method: str, path: str, canonical: Canonical
) -> PricedEffect:
    return price_request(
        policy, tool, method, path, canonical.query_map, canonical.document, canonical.body_format
    )


@router.api_route("/tools/{tool}/{path:path}", methods=METHODS, include_in_schema=False)
async def proxy(
    tool: str,
    path: str,
    request: Request,
    who: Annotated[tuple[TenantPolicy, AuthenticatedAgent], Depends(agent_auth)],
) -> Response:
    gate = gate_of(request)
    policy, agent = who
    body = await read_body(request, gate.settings.max_body_bytes)
    method = request.method
    check_raw_path(request.scope.get("raw_path") or b"")
    check_headers(request.headers.keys())
    canonical = read_request(request.url.query, request.headers.getlist("content-type"), body)
    effect = price(policy, tool, method, f"/{path}", canonical)
    check_route_scope(policy, agent, effect)
    if effect.in_process:
        raise Problem(403, "in_process_route", "this route is decision-only: use /v1/holds")
    check_per_effect_cap(agent, effect)
    route_id = effect.route.route_id if effect.route else f"{tool} {method} /{path}"
    # What goes upstream is re-encoded from what was priced, never the agent's bytes.
    query, forwarded = canonical.query_text, canonical.body
    stored = StoredRequest(
        agent.agent_id,
        tool,
        method,
        f"/{path}",
        query,
        canonical.content_type,
        base64.b64encode(forwarded).decode(),
        route_id,
        effect.price_micros,
        passed_headers(policy, tool, request),
        face_value=effect.face_value_micros,
        effect_class=effect.effect_class.value,
    )
    if effect.effect_class is EffectClass.READ:
        target = target_of(gate, policy, tool)
        answer = await forward(gate.http, target, stored, "", gate.settings.upstream_timeout_s)
        return answer_response(answer, {"X-Irrev-Decision": "admit", "X-Irrev-Price": "0"})
    hold_id = hold_id_for(policy.tenant, agent.agent_id, route_id, agent_key_of(request))
    # A trace context is new on every attempt by design; it does not change the effect.
    effect_headers = tuple(h for h in stored.headers if h[0] not in TRACE_HEADERS)
    digest = fingerprint(method, f"/{path}", query, forwarded, effect_headers)
    result = await reserve(gate, policy, agent, effect, hold_id, digest, stored)
    return await respond(gate, policy, result, hold_id, stored)


async def respond(
    gate: Gate, policy: TenantPolicy, result: ReserveResult, hold_id: str, stored: StoredRequest
) -> Response:
    if result.decision is Decision.DENY:
        raise refusal(result, hold_id)
    if result.state is HoldState.ESCALATED:
        return escalated_response(policy.tenant, hold_id, result)
    if not result.replayed:
        answer = await fire(gate, policy, hold_id, stored, result.deadline_ms)
        return answer_response(answer, budget_headers(result, hold_id))
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is not None and hold.outcome:
        recorded = StoredAnswer.loads(hold.outcome)
        if hold.state is HoldState.VOIDED and recorded.status // 100 == 2:
            # An upstream 2xx never voids: this is the receipt of a void through the
            # holds API, not an answer to give back as the effect's.
            raise Problem(
                409,
                "hold_voided",
                "this effect's hold was voided, so it was not made; use a new "
                "Idempotency-Key to make it",
                hold=hold_id,
                state=hold.state.value,
            )
        headers = budget_headers(result, hold_id, replayed=True)
        return stored_response(recorded, headers)
    if hold is not None and hold.state is HoldState.AMBIGUOUS:
        # The first outcome is unknown: retry, with the same Idempotency-Key, so the
        # tool API can deduplicate it (contract 4).
        answer = await fire(gate, policy, hold_id, StoredRequest.loads(hold.request), None)
        return answer_response(answer, budget_headers(result, hold_id, replayed=True))
    raise settled_problem(hold.state if hold else result.state, hold_id)
