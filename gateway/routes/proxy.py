"""`/tools/{tool}/{path}`: the trusted proxy in front of the tenant's tool APIs. It
parses the agent's request into an `Intent`, runs the admission pipeline
(gateway/pipeline/: prepare, reserve, deliver) and shapes what came back into the agent's answer."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from gateway.edge import tracecontext
from gateway.edge.auth import agent_auth
from gateway.edge.bodies import read_body
from gateway.edge.canonical import check_headers, check_raw_path, read_request
from gateway.edge.problems import Problem
from gateway.edge.responses import (
    answer_response,
    decided_headers,
    decision_headers,
    escalated_response,
    stored_response,
)
from gateway.edge.wire import Headers, StoredAnswer
from gateway.pipeline.decision import Decision, admit
from gateway.pipeline.prepare import CONTENT_KEY_PREFIX, Gate, Intent, prepare, upstream_of
from gateway.pipeline.upstream import Answer
from pricing import AuthenticatedAgent, TenantPolicy

_VISIBLE_ASCII = re.compile(r"[\x20-\x7e\t]*")

router = APIRouter()
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
READ_HEADERS = {"X-Irrev-Decision": "admit", "X-Irrev-Price": "0"}
# The key an effect is held under: the agent's own, or the one its content gave a
# request sent without one (admission.content_key), which repeats may carry.
KEY_HEADER = "X-Irrev-Idempotency-Key"


def passed_headers(policy: TenantPolicy, tool: str, headers: Iterable[tuple[str, str]]) -> Headers:
    """The agent's headers the tool lets through (names lower-case, sorted by name, in
    their order within a name); everything else it sent stays at the gateway, and so
    does a trace context that is not valid (dropped before the check below: it is not
    a refusal)."""
    allowed = policy.catalog.forwarded_headers.get(tool, frozenset())
    kept = [(name, value) for name, value in tracecontext.checked(headers) if name in allowed]
    for name, value in kept:
        if not _VISIBLE_ASCII.fullmatch(value):
            # Checked before anything is held: the HTTP client sends ASCII only, so such
            # a value would fail the forward after the hold was charged.
            raise Problem(
                400,
                "bad_header",
                f"header {name}: its value must be printable ASCII (tabs and spaces "
                "allowed); it is passed to the tool API as it is",
            )
    return tuple(sorted(kept, key=lambda header: header[0]))


@router.api_route("/tools/{tool}/{path:path}", methods=METHODS, include_in_schema=False)
async def proxy(
    tool: str,
    path: str,
    request: Request,
    who: Annotated[tuple[TenantPolicy, AuthenticatedAgent], Depends(agent_auth)],
) -> Response:
    gate, (policy, agent) = Gate.of(request), who
    with gate.agents.slot(policy, agent):
        return await _proxy(gate, policy, agent, tool, path, request)


async def _proxy(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    tool: str,
    path: str,
    request: Request,
) -> Response:
    settings = gate.settings
    limits = policy.document.request_limits
    largest = min(settings.max_body_bytes, limits.max_body_bytes)
    body = await read_body(request, largest, settings.body_timeout_s)
    check_raw_path(request.scope.get("raw_path") or b"")
    check_headers(request.headers.keys())
    content_types = request.headers.getlist("content-type")
    canonical = read_request(request.url.query, content_types, body, limits)
    intent = Intent(
        tool=tool,
        operation=request.method,
        target=f"/{path}",
        canonical=canonical,
        keys=request.headers.getlist("idempotency-key"),
        headers=passed_headers(policy, tool, request.headers.items()),
    )
    prepared = prepare(policy, agent, intent, in_process=False)
    decision = await admit(gate, policy, agent, prepared, upstream_of(gate, policy, tool))
    return decision_response(policy, decision, repeatable=not prepared.request.alone)


def repeat_phrase(decision: Decision, repeatable: bool) -> str:
    """How an agent asks again about its escalated request; '' if it cannot."""
    if not repeatable:
        return ""
    if decision.key.startswith(CONTENT_KEY_PREFIX):
        return "send the identical request again: it is the same effect, not a new one"
    return "send the same request again with the same Idempotency-Key"


def decision_response(
    policy: TenantPolicy, decision: Decision | Answer, repeatable: bool = True
) -> Response:
    """The agent's answer. `repeatable`: whether repeating the request reaches this
    effect (StoredRequest.alone: not for one sent without a key on a route whose
    identical requests are each a new effect)."""
    if isinstance(decision, Answer):  # a read: nothing held, nothing charged
        unit = {"X-Irrev-Currency": policy.catalog.currency, "X-Irrev-Scale": str(policy.scale)}
        return answer_response(decision, {**READ_HEADERS, **unit})
    if decision.answer is None:  # escalated: a person decides
        response = escalated_response(policy, decision, repeat_phrase(decision, repeatable))
        response.headers[KEY_HEADER] = decision.key
        return response
    headers = decision_headers(policy, decision)
    headers |= decided_headers(decision.by, decision.note)
    headers[KEY_HEADER] = decision.key
    if isinstance(decision.answer, StoredAnswer):
        return stored_response(decision.answer, headers)
    return answer_response(decision.answer, headers, repeatable)
