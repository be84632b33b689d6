"""The seam between the admission pipeline and a tool's API: an `Upstream` makes an
admitted effect and says what became of it. The pipeline (gateway/admission.py)
prices, holds, and settles the hold by the `Answer`'s fate; an upstream only
delivers. HTTP tool APIs are one implementation (gateway/http_upstream.py); another
protocol (MCP tools/call) is another, behind the same three-argument call.

What an answer's fate does to the hold: delivered (the effect happened: post),
refused (it did not: void), not sent (provably never left the gateway: void; both
only on a first send: a retry refused or not sent leaves an ambiguous hold so),
unknown (it may have happened: ambiguous, stays charged), in progress (only on a
retry of an ambiguous hold: the upstream is still making the first delivery; the
hold stays ambiguous)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from .wire import StoredRequest


class Fate(StrEnum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What an upstream said, as the agent gets it.

    `status`, `headers` and `body` are an HTTP answer (an upstream of another protocol
    maps its result to one); `headers` are only those that may reach the agent (the
    pipeline keeps them with the settled hold for repeats). `why` is a short reason
    code for NOT_SENT and UNKNOWN (`upstream_timeout`, `upstream_reset`, ...): it is
    recorded with an ambiguous hold, and a `timeout` in it makes the agent's answer a
    504 rather than a 502."""

    fate: Fate
    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    why: str = ""
    # The body as the upstream's client parsed it (an MCP CallToolResult), so that
    # the agent's answer is shaped without parsing it again; None from an HTTP API.
    parsed: object = field(default=None, compare=False, repr=False)


class Upstream(Protocol):
    """A tool's API as the admission pipeline calls it. `resends`: a repeat of an
    ambiguous effect's key may send it again, because the upstream deduplicates by
    the key it is given (HTTP tool APIs by contract 4; an MCP server only where the
    policy declares it); else a repeat answers from the ledger only. `key_name`: how
    messages to the agent name its key."""

    @property
    def resends(self) -> bool: ...

    @property
    def key_name(self) -> str:
        """Where the agent sends its idempotency key for this upstream's effects (a
        header to /tools, `_meta` to /mcp), as the messages that ask for it say."""
        ...

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        """Make `effect` (exactly the request that was priced) once, and say what
        became of it. Never raises for anything the upstream does: an error is a fate.

        `hold_id` names the effect to the upstream so that it can deduplicate repeats
        (send it as the idempotency key, `wire.upstream_key(hold_id)`); it is '' for a
        read, which holds nothing and goes without one. `deadline` is a
        `time.monotonic()` instant: return by then (with Fate.UNKNOWN if the effect was
        sent and no answer came), since the hold may turn ambiguous soon after.
        `retry` is True when the hold is ambiguous and this is the same effect sent
        again under the same `hold_id`: an answer meaning "a request under this key is
        still being made" is then Fate.IN_PROGRESS (on a first delivery, never)."""
        ...
