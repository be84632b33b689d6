"""An agent's W3C Trace Context (https://www.w3.org/TR/trace-context/), checked before
it is passed to a tool (gateway/routes/proxy.py) or made the parent of the gateway's spans
(gateway/edge/tracing.py). Both headers are the agent's to send and neither is priced, so
one that is not valid is dropped, never a refusal of the effect: the tool (or the
gateway) then starts a trace of its own, as the specification says a receiver of an
unparsable traceparent does. What was dropped is bounded: 4 KB of traceparent reached
the tool before (issue 26).

- `traceparent`: exactly one field, `version-traceid-parentid-flags` in lower-case hex,
  55 characters; version `ff` is invalid, and a trace id or parent id of all zeros.
  A later version is passed only in these four fields: this gateway cannot check a
  field that version 00 does not define, and the specification lets a receiver that
  cannot parse one restart the trace.
- `tracestate`: only beside a valid traceparent (the specification: a receiver that
  could not parse traceparent must not parse tracestate). Its fields, joined with
  commas (RFC 9110), are at most 512 characters and 32 list members (empty members
  and the spaces and tabs around members are allowed), each `key=value` by the Level 2
  grammar (a key of up to 256 of `a-z 0-9 _ - * / @` starting with a letter or digit,
  a value of up to 256 printable ASCII characters but `,` and `=`, not ending in a
  space), no key twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<parent>[0-9a-f]{16})-[0-9a-f]{2}"
)
_KEY = r"[a-z0-9][a-z0-9_*/@-]{0,255}"
_CHR = r"\x20-\x2b\x2d-\x3c\x3e-\x7e"  # printable ASCII but ',' and '='
_NBLK = r"\x21-\x2b\x2d-\x3c\x3e-\x7e"  # nor a space: the last of a value
_MEMBER = re.compile(rf"(?P<key>{_KEY})=[{_CHR}]{{0,255}}[{_NBLK}]")
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_CHARS = 512


def valid_traceparent(value: str) -> bool:
    found = _TRACEPARENT.fullmatch(value)
    return (
        found is not None
        and found["version"] != "ff"
        and found["trace"] != "0" * 32
        and found["parent"] != "0" * 16
    )


def valid_tracestate(fields: Sequence[str]) -> bool:
    """`fields`: the values of every tracestate header, in the order they came."""
    combined = ",".join(fields)
    if len(combined) > MAX_TRACESTATE_CHARS:
        return False
    members = [member.strip(" \t") for member in combined.split(",")]
    keys = []
    for member in filter(None, members):
        found = _MEMBER.fullmatch(member)
        if found is None:
            return False
        keys.append(found["key"])
    return len(keys) <= MAX_TRACESTATE_MEMBERS and len(set(keys)) == len(keys)


def checked(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """`headers` (names lower-case) in their order, without the trace context unless it
    is valid: the traceparent if it is, and the tracestate too if both are."""
    pairs = list(headers)
    parents = [value for name, value in pairs if name == TRACEPARENT]
    states = [value for name, value in pairs if name == TRACESTATE]
    parent_kept = len(parents) == 1 and valid_traceparent(parents[0])
    dropped = set() if parent_kept else {TRACEPARENT}
    if not (parent_kept and valid_tracestate(states)):
        dropped.add(TRACESTATE)
    return [(name, value) for name, value in pairs if name not in dropped]
