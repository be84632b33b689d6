"""A person's reason for a decision (approve, reject, resolve, a rule): shown to the
agent and journaled, so it is bounded and has no control characters (which would
forge lines in logs, terminals and the console)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

MAX_NOTE_CHARS = 500  # at most 2000 bytes of UTF-8: within the ledger's 2048

Note = Annotated[
    str, StringConstraints(max_length=MAX_NOTE_CHARS, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")
]


class Decision(BaseModel):
    """The optional body of an approval or a rejection."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Note = ""
