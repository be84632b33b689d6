"""Turning answers and decisions into HTTP responses for the agent."""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

from fastapi.responses import JSONResponse, Response

from gateway.edge.advice import Retry, escalation_sentence, units_of
from gateway.edge.problems import Problem, kept_problem
from gateway.edge.wire import BODY_OMITTED, BODY_OMITTED_REASON, BODY_SHA256, StoredAnswer
from gateway.pipeline.upstream import Answer, Fate
from ledger import Hold, HoldState, ReserveResult
from pricing import (
    GATEWAY_HEADER_PREFIXES,
    NEVER_RETURNED,
    TenantPolicy,
    header_money,
    rfc3339,
    with_money_text,
)


def escalation_id(tenant: str, hold_id: str) -> str:
    return f"{tenant}.{hold_id}"


def parse_escalation_id(escalation: str) -> tuple[str, str]:
    tenant, sep, hold_id = escalation.rpartition(".")
    if not sep or not tenant or not hold_id:
        raise Problem(404, "not_found", "no such escalation")
    return tenant, hold_id


def amounts_in_currency(
    policy: TenantPolicy, **amounts: int | dict[str, int] | None
) -> dict[str, Any]:
    """Amounts in the tenant's minor units, each with its `_text`, and `currency`."""
    return with_money_text(amounts, policy.scale, policy.catalog.currency)


def hold_view(policy: TenantPolicy, hold: Hold) -> dict[str, Any]:
    view: dict[str, Any] = {
        "hold": hold.hold_id,
        "state": hold.state.value,
        "decision": hold.decision.value,
        "reason": hold.reason.value,
        **amounts_in_currency(
            policy, amounts=hold.amounts, posted=hold.posted, compensated=hold.compensated
        ),
        "flags": sorted(hold.flags),
        "deadline_ms": hold.deadline_ms,
        "deadline_at": rfc3339(hold.deadline_ms),
    }
    if hold.state is HoldState.ESCALATED:
        view["escalation"] = escalation_id(policy.tenant, hold.hold_id)
    return view


class Shadow(Protocol):
    """What enforcement would have done with an effect shadow mode let through."""

    @property
    def decision(self) -> str: ...

    @property
    def reason(self) -> str: ...


class Decided(Protocol):
    """A decision as the HTTP shapers read it (gateway/pipeline/decision.py's
    `Decision`: the pipeline's record, which the edge renders without importing)."""

    @property
    def result(self) -> ReserveResult: ...

    @property
    def hold_id(self) -> str: ...

    @property
    def decision(self) -> str: ...

    @property
    def replayed(self) -> bool: ...

    @property
    def shadowed(self) -> Shadow | None: ...

    @property
    def stress(self) -> str: ...

    @property
    def calm_price(self) -> int: ...


def decision_headers(policy: TenantPolicy, decided: Decided) -> dict[str, str]:
    """The decision in headers: X-Irrev-Decision and -Hold, X-Irrev-Price and
    -Remaining in integer minor units for programs, the same with their currency
    (`-Text`) for people, and X-Irrev-Currency and -Scale (minor units per major unit)
    that say what the integers count, what enforcement would have done with an
    effect shadow mode let through, and X-Irrev-Stress (with X-Irrev-Calm-Price, the
    price it falls to) where the route has a burst detector."""
    scale, currency = policy.scale, policy.catalog.currency
    result = decided.result
    headers = {
        "X-Irrev-Decision": decided.decision,
        "X-Irrev-Hold": decided.hold_id,
        "X-Irrev-Price": str(result.price),
        "X-Irrev-Remaining": str(result.remaining),
        "X-Irrev-Price-Text": header_money(result.price, scale, currency),
        "X-Irrev-Remaining-Text": header_money(result.remaining, scale, currency),
        "X-Irrev-Currency": currency,
        "X-Irrev-Scale": str(scale),
    }
    if decided.shadowed is not None:
        headers["X-Irrev-Mode"] = "shadow"
        headers["X-Irrev-Shadow-Decision"] = decided.shadowed.decision
        headers["X-Irrev-Shadow-Reason"] = decided.shadowed.reason
    if decided.replayed:
        headers["X-Irrev-Replayed"] = "true"
    if decided.stress:
        # A burst across the fleet (on), or a hold kept at that price until the
        # route's detector vouches that none was under way (margin).
        headers["X-Irrev-Stress"] = decided.stress
    if decided.calm_price:
        headers["X-Irrev-Calm-Price"] = str(decided.calm_price)
    return headers


# Printable ASCII but `%` stays as it is; anything else (a note is any text without
# control characters) is percent-encoded UTF-8, as header values are ASCII.
HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_text(text: str) -> str:
    """`text` as a header value: decoded by urllib.parse.unquote (or decodeURIComponent)."""
    return quote(text, safe=HEADER_SAFE)


def decided_headers(by: str, note: str) -> dict[str, str]:
    """Who approved an escalated effect and why, beside the tool's answer."""
    if not by:
        return {}
    headers = {"X-Irrev-Decided-By": header_text(by)}
    if note:
        headers["X-Irrev-Note"] = header_text(note)
    return headers


def upstream_response(
    status: int,
    headers: list[tuple[str, str]] | tuple[tuple[str, str], ...],
    body: bytes,
    extra: dict[str, str],
) -> Response:
    response = Response(content=body, status_code=status)
    # What may pass was chosen (per tool) when the answer came; this is the backstop.
    for name, value in headers:
        lower = name.lower()
        if lower not in NEVER_RETURNED and not lower.startswith(GATEWAY_HEADER_PREFIXES):
            response.headers.append(name, value)
    for name, value in extra.items():
        response.headers[name] = value
    return response


def answer_response(answer: Answer, extra: dict[str, str], repeatable: bool = True) -> Response:
    """What the agent gets back from a forwarded effect. `repeatable`: whether
    repeating the call reaches this effect (its key, or its content within the route's
    window); not for a call sent without a key on a `dedupe_window: 0` route, whose
    repeat would be a new effect, so an unknown outcome must not be learnt that way."""
    if answer.fate is Fate.NOT_SENT:
        raise Problem(
            502,
            "upstream_unreachable",
            "the tool API could not be reached; nothing was sent and the hold was released",
            headers=extra,
            why=answer.why,
        )
    if answer.fate is Fate.IN_PROGRESS:
        raise Problem(
            409,
            "in_flight",
            "the tool API is still making this effect (it answered 'in progress' to the "
            "retry); it stays charged",
            headers={**extra, "Retry-After": _retry_after(answer)},
            hold=extra.get("X-Irrev-Hold"),
            upstream_status=answer.status,
        ).reached_again(repeatable)
    if answer.fate is Fate.UNKNOWN:
        resent = (
            " (a repeat is sent to the tool API under the same key, which it deduplicates)"
            if repeatable
            else ""
        )
        raise Problem(
            504 if "timeout" in answer.why else 502,
            "upstream_ambiguous",
            f"the effect may or may not have happened; it stays charged until reconciled{resent}",
            headers=extra,
            why=answer.why,
            upstream_status=answer.status or None,
        ).reached_again(repeatable)
    http = answer.as_http()
    return upstream_response(http.status, http.headers, answer.payload, extra)


def _retry_after(answer: Answer) -> str:
    """The upstream's own delay if it gave a sensible one (in seconds), else 1."""
    headers = answer.http.headers if answer.http is not None else ()
    given = dict((k.lower(), v) for k, v in headers).get("retry-after", "")
    return given if given.isascii() and given.isdigit() and 1 <= int(given) <= 60 else "1"


# What decision_headers says of an admission besides its hold: its decision and figures.
DECISION_HEADERS = frozenset(
    {
        "X-Irrev-Decision",
        "X-Irrev-Price",
        "X-Irrev-Remaining",
        "X-Irrev-Price-Text",
        "X-Irrev-Remaining-Text",
        "X-Irrev-Currency",
        "X-Irrev-Scale",
    }
)
# Kept refusals of the admission itself: the hold was released before anything was
# sent, and the first answer was a refusal like any other, without a decision or
# figures. A repeat of the key gets that answer back (contract 3), not the `admit` of
# the released hold and the price of an effect that was never made. (A kept
# upstream_unreachable answered an admitted effect's send, with its decision.)
WITHDRAWN_ADMISSIONS = frozenset({"not_replicated", "not_fsynced"})


# How a repeat names each note on a body its kept answer left out (wire.BODY_NOTES).
OMITTED_HEADERS = {
    BODY_OMITTED: "X-Irrev-Body-Omitted",
    BODY_SHA256: "X-Irrev-Body-Sha256",
    BODY_OMITTED_REASON: "X-Irrev-Body-Omitted-Reason",
}


def stored_response(stored: StoredAnswer, extra: dict[str, str]) -> Response:
    if stored.reason:
        # The gateway's own problem, kept for repeats: a whole problem document, marked
        # X-Irrev-Reason as it was the first time (problems.Problem), so that nobody
        # takes it for the tool's answer.
        if stored.reason in WITHDRAWN_ADMISSIONS:
            extra = {k: v for k, v in extra.items() if k not in DECISION_HEADERS}
        return kept_problem(stored.status, stored.reason, stored.body, extra).response()
    # The gateway's own notes on a body it did not keep (its length, digest and why):
    # the backstop drops every X-Irrev-* header among the kept ones, so they go back
    # beside them.
    notes = {OMITTED_HEADERS[name]: value for name, value in stored.omitted().items()}
    return upstream_response(stored.status, stored.headers, stored.body, {**extra, **notes})


def escalated_response(policy: TenantPolicy, decided: Decided, repeat: str) -> JSONResponse:
    """202: a person decides. `repeat` says how the agent asks again (its key, or for a
    call keyed by its content, the identical request); '' when nothing it sends reaches
    this escalation again (no key, on a `dedupe_window: 0` route), where only the poll
    does: its repeat would be a second escalation, and a second effect once approved."""
    result = decided.result
    escalation = escalation_id(policy.tenant, decided.hold_id)
    location = f"/v1/escalations/{escalation}"
    said = escalation_sentence(units_of(policy), result, escalation)
    if repeat:
        then, retry = f"Poll {location} for the result, or {repeat}.", Retry.SAME_CALL
    else:
        then, retry = (
            f"Poll {location} for the result; do not send this request again to learn it: "
            "an identical request would be a new one, waiting for a person again.",
            Retry.NO,
        )
    body = {
        "status": "escalated",
        "escalation": escalation,
        "detail": f"{said}. {then}",
        "retry": retry.value,
        "reason": result.reason.value,
        **amounts_in_currency(policy, price=result.price),
        "poll": location,
        "deadline_ms": result.deadline_ms,
        "deadline_at": rfc3339(result.deadline_ms),
    }
    headers = {**decision_headers(policy, decided), "Location": location, "Retry-After": "2"}
    return JSONResponse(body, 202, headers=headers)
