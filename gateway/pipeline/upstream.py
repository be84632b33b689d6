"""The seam between the admission pipeline and a tool's API: an `Upstream` makes an
admitted effect and says what became of it. The pipeline (gateway/pipeline/: prepare,
reserve, deliver) prices, holds, and settles the hold by the `Answer`'s fate; an
upstream only delivers. HTTP tool APIs are one implementation
(gateway/state/http_upstream.py); another protocol (MCP tools/call) is another, behind
the same three-argument call, and no protocol's terms cross the seam but the HTTP
API's own status and headers, which the proxy passes on (`HttpMeta`).

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

from gateway.edge.wire import Headers, StoredRequest


class Fate(StrEnum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"


# An answer without an HTTP status of its own, as HTTP's shape has it (Answer.as_http).
HTTP_STATUS_OF_FATE = {Fate.DELIVERED: 200, Fate.REFUSED: 422}


@dataclass(frozen=True)
class HttpMeta:
    """What an HTTP tool API answered besides its body: its status, and those of its
    headers that may reach the agent (kept with the settled hold for repeats)."""

    status: int
    headers: Headers = ()


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What an upstream said, in no protocol's terms: its `fate`, its `payload` as
    the agent gets it (opaque here) and that payload's `media_type`. `why` is a short
    reason code for NOT_SENT and UNKNOWN (`upstream_timeout`, `upstream_reset`, ...): it
    is recorded with an ambiguous hold, and a `timeout` in it makes an HTTP agent's
    answer a 504 rather than a 502. `http`: an HTTP tool API's own status and headers,
    which the proxy passes on; None from another protocol (MCP) and when nothing came."""

    fate: Fate
    payload: bytes = b""
    media_type: str = ""
    why: str = ""
    http: HttpMeta | None = None
    # The payload as the upstream's client parsed it (an MCP CallToolResult), so that
    # the agent's answer is shaped without parsing it again; None from an HTTP API.
    parsed: object = field(default=None, compare=False, repr=False)

    @property
    def status(self) -> int | None:
        """The HTTP status, for logs and traces; None from another protocol."""
        return self.http.status if self.http is not None else None

    def as_http(self) -> HttpMeta:
        """The answer in HTTP's shape, as a settled hold keeps it and an approval
        returns it: an HTTP API's own status and headers; another protocol's payload
        under the status its fate has over HTTP, with its media type."""
        if self.http is not None:
            return self.http
        return HttpMeta(HTTP_STATUS_OF_FATE[self.fate], (("content-type", self.media_type),))


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
