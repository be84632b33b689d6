"""Turning answers and decisions into HTTP responses for the agent."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response

from ledger.records import ReserveResult

from .problems import Problem
from .upstream import Answer, Fate
from .wire import KEPT_RESPONSE_HEADERS, StoredAnswer


def escalation_id(tenant: str, hold_id: str) -> str:
    return f"{tenant}.{hold_id}"


def parse_escalation_id(escalation: str) -> tuple[str, str]:
    tenant, sep, hold_id = escalation.rpartition(".")
    if not sep or not tenant or not hold_id:
        raise Problem(404, "not_found", "no such escalation")
    return tenant, hold_id


def budget_headers(
    result: ReserveResult, hold_id: str, *, replayed: bool = False
) -> dict[str, str]:
    headers = {
        "X-Irrev-Decision": result.decision.value,
        "X-Irrev-Hold": hold_id,
        "X-Irrev-Price": str(result.price),
        "X-Irrev-Remaining": str(result.remaining),
    }
    if replayed:
        headers["X-Irrev-Replayed"] = "true"
    return headers


def upstream_response(
    status: int,
    headers: list[tuple[str, str]] | tuple[tuple[str, str], ...],
    body: bytes,
    extra: dict[str, str],
) -> Response:
    response = Response(content=body, status_code=status)
    for name, value in headers:
        if name.lower() in KEPT_RESPONSE_HEADERS:
            response.headers.append(name, value)
    for name, value in extra.items():
        response.headers[name] = value
    return response


def answer_response(answer: Answer, extra: dict[str, str]) -> Response:
    """What the agent gets back from a forwarded effect."""
    if answer.fate is Fate.NOT_SENT:
        raise Problem(
            502,
            "upstream_unreachable",
            "the tool API could not be reached; nothing was sent and the hold was released",
            headers=extra,
            why=answer.why,
        )
    if answer.fate is Fate.UNKNOWN:
        raise Problem(
            504 if "timeout" in answer.why else 502,
            "upstream_ambiguous",
            "the effect may or may not have happened; it stays charged until reconciled. "
            "Retry with the same Idempotency-Key: the tool API deduplicates it.",
            headers=extra,
            why=answer.why,
            upstream_status=answer.status or None,
        )
    return upstream_response(answer.status, answer.headers, answer.body, extra)


def stored_response(stored: StoredAnswer, extra: dict[str, str]) -> Response:
    return upstream_response(stored.status, stored.headers, stored.body, extra)


def escalated_response(tenant: str, hold_id: str, result: ReserveResult) -> JSONResponse:
    escalation = escalation_id(tenant, hold_id)
    location = f"/v1/escalations/{escalation}"
    body = {
        "status": "escalated",
        "escalation": escalation,
        "reason": result.reason.value,
        "price": result.price,
        "poll": location,
        "deadline_ms": result.deadline_ms,
    }
    headers = {**budget_headers(result, hold_id), "Location": location, "Retry-After": "2"}
    return JSONResponse(body, 202, headers=headers)
