"""Which headers cross the gateway, each way: what an agent's request may carry to
the upstream, and what of the upstream's answer goes back to the agent."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

# RFC 9110 token: what a header field name may be.
HeaderName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")]

# Agents' request headers that reach the upstream on every tool; a tool adds its own
# (API-version headers such as Stripe-Version) with `forward_headers`. Not Accept: a
# framework that negotiates the answer's format after its handler ran answers 406 to
# an Accept it cannot meet, after the effect, and the agent would choose that 4xx.
DEFAULT_FORWARD_HEADERS = frozenset({"traceparent", "tracestate"})
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# What the gateway sets itself on every request it sends: never a credential, never
# the agent's.
FRAMING = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "expect", "idempotency-key"}
)
# Headers that make a framework read another method than the one priced.
METHOD_OVERRIDE_HEADERS = frozenset(
    {"x-http-method-override", "x-http-method", "x-method-override"}
)
# Never taken from an agent: its own credentials, what frames or routes the request,
# and method overrides.
NEVER_FORWARDED = (
    HOP_BY_HOP
    | FRAMING
    | METHOD_OVERRIDE_HEADERS
    | {"authorization", "proxy-authorization", "cookie", "forwarded"}
)
# Never passed back to an agent: cookies and credentials of the upstream, framing the
# gateway recomputes (httpx has decoded any content-encoding), and the gateway's own.
NEVER_RETURNED = HOP_BY_HOP | {
    "set-cookie",
    "set-cookie2",
    "authorization",
    "proxy-authorization",
    "www-authenticate",
    "proxy-authenticate",
    "content-length",
    "content-encoding",
}
GATEWAY_HEADER_PREFIXES = ("x-irrev-", "x-forwarded-")
