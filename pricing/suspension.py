"""An agent an operator stopped: `agents.<id>.suspended` in the policy. It lives in
the policy, not beside it, so that stopping an agent is a policy change like any
other: versioned in the fleet's store, merged field by field against concurrent
edits and in force on every host within one refresh (docs/policy.md, "Suspended
agents")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

# The approve and reject reasons' rules (gateway/edge/bodies.py, Note): shown to
# people in logs, terminals and the console, so no control or format characters
# that could forge a line or hide text.
PLAIN_TEXT = r"^[^\x00-\x1f\x7f-\x9f\p{Cf}\p{Zl}\p{Zp}]*$"
MAX_REASON_CHARS = 500

SuspensionReason = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS, pattern=PLAIN_TEXT)
]
AdminName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=PLAIN_TEXT)]
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
