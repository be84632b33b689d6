"""An agent an operator stopped: `agents.<id>.suspended` in the policy. It lives in
the policy, not beside it, so that stopping an agent is a policy change like any
other: versioned in the fleet's store, merged field by field against concurrent
edits and in force on every host within one refresh (docs/policy.md, "Suspended
agents")."""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints

MAX_REASON_CHARS = 500
# Unicode's format characters and line and paragraph separators.
_HIDDEN = frozenset({"Cf", "Zl", "Zp"})


def plain_text(text: str) -> str:
    """The approve and reject reasons' rules (gateway/edge/bodies.py, Note): shown to
    people in logs, terminals and the console, so no control or format characters
    that could forge a line or hide text. Checked here, not by a pattern: the policy's
    JSON Schema (`irrev policy schema`) must hold only patterns every validator reads,
    and a Unicode category (\\p{Cf}) is not one of them."""
    for char in text:
        if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F or unicodedata.category(char) in _HIDDEN:
            raise ValueError(
                f"no control or format characters, nor line or paragraph separators "
                f"(found U+{ord(char):04X})"
            )
    return text


SuspensionReason = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_REASON_CHARS),
    AfterValidator(plain_text),
]
AdminName = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(plain_text)
]
# What pricing.rfc3339 writes from Redis's clock, to the millisecond, in UTC.
UtcInstant = Annotated[
    str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")
]


class Suspension(BaseModel):
    """Why, by whom and since when an agent is refused every call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: SuspensionReason
    by: AdminName
    at: UtcInstant
