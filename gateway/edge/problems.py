"""Every refusal as `application/problem+json` (RFC 9457) with a `reason` code and,
where a budget decided, the numbers that led to it. One module maps errors to
responses, so no route builds an error body by hand and bad input never gets a 500."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any, TypedDict

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.edge import metrics
from gateway.edge.advice import next_step, told
from gateway.state import refusals
from ledger import (
    ArchivedCopyMissing,
    BadInput,
    HoldNotFound,
    HoldStateConflict,
    IdempotencyConflict,
    LedgerUnavailable,
    RateLimited,
    RedisFailure,
    UnknownAccount,
)
from pricing import RequestError, Suspension

PROBLEM_JSON = "application/problem+json"
# A schema refusal lists this many errors, each cut to these lengths, and counts the
# rest: one error per extra key of a large body made answers of megabytes.
MAX_LISTED_ERRORS = 20
MAX_FIELD_CHARS = 128
MAX_MESSAGE_CHARS = 256
log = logging.getLogger("irrev.gateway")


class Problem(Exception):
    def __init__(
        self,
        status: int,
        reason: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra
        self.repeatable = True

    def reached_again(self, repeatable: bool) -> Problem:
        """This problem, saying whether repeating the call reaches its effect: not for
        one held under a key its caller did not send (advice.next_step), whose repeat
        would be a new effect."""
        self.repeatable = repeatable
        return self

    @property
    def text(self) -> str:
        """What a model reads: the detail and the next step (gateway/edge/advice.py)."""
        return told(self.detail, self.reason, self.repeatable)

    def document(self) -> dict[str, Any]:
        """The problem+json members."""
        return {
            "type": f"https://irrev.dev/problems/{self.reason}",
            "title": self.reason.replace("_", " "),
            "status": self.status,
            "reason": self.reason,
            "detail": self.text,
            "retry": next_step(self.reason, self.repeatable)[0].value,
            **self.extra,
        }

    def response_headers(self) -> dict[str, str]:
        # X-Irrev-Reason marks the refusal as the gateway's: a tool's answer passes through
        # with its own problem+json, but never with an X-Irrev-* header (responses.py).
        return {**self.headers, "X-Irrev-Reason": self.reason}

    def response(self) -> JSONResponse:
        return JSONResponse(
            self.document(), self.status, headers=self.response_headers(), media_type=PROBLEM_JSON
        )


def kept_problem(
    status: int, reason: str, body: bytes, headers: dict[str, str] | None = None
) -> Problem:
    """The gateway's own refusal kept as an effect's answer (wire.StoredAnswer.reason),
    whole again for a repeat or a poll: its type, title and status follow from its
    status and reason, so a record need keep only the rest (its detail, its numbers),
    and records that kept no more than reason and detail come back complete too."""
    try:
        kept = json.loads(body)
    except ValueError:
        kept = {}  # read from Redis: what a record holds never turns into a 500
    if not isinstance(kept, dict):
        kept = {}
    detail = kept.pop("detail", None)
    members = {k: v for k, v in kept.items() if k not in ("type", "title", "status", "reason")}
    text = detail if isinstance(detail, str) and detail else reason.replace("_", " ")
    return Problem(status, reason, text, headers=headers, **members)


def body_timeout(timeout_s: float) -> Problem:
    """A body that did not arrive whole in time (IRREV_BODY_TIMEOUT_S)."""
    return Problem(
        408,
        "body_timeout",
        f"the request body did not arrive within {timeout_s:g} s; send it at once",
        headers={"Connection": "close"},
    )


class SuspensionMembers(TypedDict):
    suspended_by: str
    suspended_at: str
    suspension_reason: str


def suspension_members(suspension: Suspension) -> SuspensionMembers:
    """Who suspended an agent, when and why, as the members of every refusal that
    names its suspension (403 agent_suspended, 409 agent_suspended_escalation).
    Typed, not a dict[str, str]: unpacked into Problem, it must not read as its
    `headers`."""
    return {
        "suspended_by": suspension.by,
        "suspended_at": suspension.at,
        "suspension_reason": suspension.reason,
    }


def problem_for(exc: Exception) -> Problem:
    """The problem a known error becomes; anything else is a bug, reported as such."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, RequestError):
        extra = {"field": exc.field} if hasattr(exc, "field") else {}
        return Problem(exc.status, exc.reason, str(exc), **extra)
    if isinstance(exc, LedgerUnavailable):
        detail, retry = f"{exc}; nothing was admitted", {"Retry-After": "1"}
        if exc.cause is RedisFailure.MIGRATING:  # a remedy of its own: wait for the move
            return Problem(503, "ledger_migrating", detail, headers=retry)
        return Problem(503, "ledger_unavailable", detail, headers=retry)
    if isinstance(exc, RateLimited):
        wait_s = max(1, math.ceil(exc.wait_ms / 1000))
        return Problem(
            429,
            "rate_limited",
            f"{rate_owner(exc.account)} is at its request rate; nothing was done, and the "
            f"same call may be sent again in {wait_s} s",
            headers={"Retry-After": str(wait_s)},
            account=exc.account,
            retry_after_ms=exc.wait_ms,
        )
    if isinstance(exc, IdempotencyConflict):
        return Problem(409, "idempotency_conflict", str(exc), state=exc.state.value)
    if isinstance(exc, HoldStateConflict):
        return Problem(409, "state_conflict", str(exc), state=exc.state.value, by=exc.by)
    if isinstance(exc, ArchivedCopyMissing):
        return Problem(409, "archived_hold_missing", str(exc))
    if isinstance(exc, HoldNotFound):
        return Problem(404, "not_found", "no such hold for this tenant")
    if isinstance(exc, UnknownAccount):
        return Problem(422, "unknown_account", str(exc))
    if isinstance(exc, BadInput):
        return Problem(422, "bad_input", str(exc), field=exc.field)
    return Problem(500, "internal_error", "an internal error; the request was not admitted")


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def schema_problem(errors: Sequence[Any], within: tuple[str, ...] = ()) -> Problem:
    """422 bad_request with the first MAX_LISTED_ERRORS of pydantic's `errors` (field,
    located `within` the request, and message) and how many more there were: bounded
    whatever the request, as a field is named by the request's own keys, which may be
    as long as the request allows."""
    listed = [
        {
            "field": _cut(".".join(map(str, (*within, *error["loc"]))), MAX_FIELD_CHARS),
            "message": _cut(str(error["msg"]), MAX_MESSAGE_CHARS),
        }
        for error in errors[:MAX_LISTED_ERRORS]
    ]
    counted: dict[str, Any] = {"errors": listed}
    if len(errors) > len(listed):
        counted["errors_omitted"] = len(errors) - len(listed)
    return Problem(422, "bad_request", "the request does not match the schema", **counted)


def rate_owner(account: str) -> str:
    """Whose rate an account's is, for a sentence."""
    kind, _, name = account.partition(":")
    return f"The principal {name}" if kind == "principal" else f"This agent ({name})"


def refused(request: Request, problem: Problem) -> JSONResponse:
    """Every refusal becomes its answer here (or, on /mcp, through `noted`)."""
    noted(request, problem)
    return problem.response()


def noted(request: Request, problem: Problem) -> None:
    """Each refusal is counted by reason and logged once, wherever it was raised
    (before the ledger or by it), and an agent's is counted for the operator
    (gateway/state/refusals.py). The tenant and agent are those the credential named,
    if it got that far."""
    tenant = getattr(request.state, "tenant", "")
    route = request.scope.get("route")
    metrics.REFUSALS.labels(tenant, problem.reason, str(problem.status)).inc()
    refusals.seen(request, problem.reason)
    level = logging.ERROR if problem.status >= 500 else logging.INFO
    log.log(
        level,
        "refused",
        extra={
            "tenant": tenant or None,
            "agent": getattr(request.state, "agent", None),
            "route": getattr(route, "path", None),
            "path": request.url.path,
            "status": problem.status,
            "reason": problem.reason,
            "price": problem.extra.get("price"),
            "hold_id": problem.extra.get("hold"),
        },
    )


def install(app: FastAPI) -> None:
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        return refused(request, problem_for(exc))

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refused(request, schema_problem(exc.errors()))

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        return refused(request, Problem(exc.status_code, reason, str(exc.detail)))

    for error in (
        Problem,
        RequestError,
        LedgerUnavailable,
        RateLimited,
        IdempotencyConflict,
        HoldStateConflict,
        HoldNotFound,
        UnknownAccount,
        BadInput,
    ):
        app.add_exception_handler(error, on_error)
    # Anything else is a bug: still a problem+json answer, counted and logged (the
    # traceback too, by the server that re-raises it).
    app.add_exception_handler(Exception, on_error)
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
