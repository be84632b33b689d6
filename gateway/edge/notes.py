"""A person's reason for a decision (approve, reject, resolve, a rule): shown to the
agent and journaled, so it is bounded and has no control characters (which would
forge lines in logs, terminals and the console), nor format characters or line and
paragraph separators (Unicode Cf, Zl, Zp: bidi overrides that reorder what a reader
sees, zero-width characters that hide text, U+2028 that breaks a line)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from gateway.edge.bodies import read_body

MAX_NOTE_CHARS = 500  # at most 2000 bytes of UTF-8: within the ledger's 2048

Note = Annotated[
    str,
    StringConstraints(
        max_length=MAX_NOTE_CHARS, pattern=r"^[^\x00-\x1f\x7f-\x9f\p{Cf}\p{Zl}\p{Zp}]*$"
    ),
]


class Ruling(BaseModel):
    """The optional body of an approval or a rejection: a person's ruling on an
    escalation, with its reason (not the gateway's `Decision` on an effect)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Note = ""


async def ruling_of(request: Request, limit: int, timeout_s: float) -> Ruling:
    """The optional body of an approval or a rejection, read once the caller's role
    has been checked: as a body parameter it was validated first, and a viewer sending
    any body learnt 422 about its shape where it may not decide at all (403)."""
    raw = await read_body(request, limit, timeout_s)
    if not raw.strip():
        return Ruling()
    try:
        return Ruling.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from exc
