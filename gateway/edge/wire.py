"""What the gateway derives from a request and keeps with a hold: the strict JSON
body, the derived keys, and the stored request and upstream answer (as JSON text,
bodies base64, so any bytes survive)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, fields, replace
from decimal import Decimal
from typing import Any

from gateway.edge.problems import Problem
from pricing import RequestLimits

Headers = tuple[tuple[str, str], ...]
MAX_JSON_DEPTH = 32
DEFAULT_LIMITS = RequestLimits()
MAX_RECORDED_BODY = 256 * 1024
# The notes a kept answer carries in place of a body it does not keep: its length, its
# SHA-256 (hex) and why it was left out, BODY_TOO_LARGE (over MAX_RECORDED_BODY) or
# OVER_ALLOWANCE (past its agent's request_limits.kept_answer_bytes of the day).
BODY_OMITTED = "x-irrev-body-omitted"
BODY_SHA256 = "x-irrev-body-sha256"
BODY_OMITTED_REASON = "x-irrev-body-omitted-reason"
BODY_NOTES = (BODY_OMITTED, BODY_SHA256, BODY_OMITTED_REASON)
BODY_TOO_LARGE = "too_large"
OVER_ALLOWANCE = "kept_answer_allowance"
# Only headers that describe the answer's body reach the agent, live or replayed (so a
# repeat gets what the first call got): no upstream cookies, connection or server
# details; httpx has decoded any content-encoding, and the length is recomputed.
KEPT_RESPONSE_HEADERS = frozenset(
    {"content-type", "location", "etag", "retry-after", "content-language"}
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # An upstream may read the first of two duplicate keys where Python reads the last,
    # or match keys case-insensitively (Go's encoding/json takes the last of `amount`
    # and `Amount`, and folds U+017F, the long s, to `s`): then what was priced would
    # not be what is executed.
    result: dict[str, Any] = {}
    folded: dict[str, str] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        other = folded.setdefault(key.casefold(), key)
        if other != key:
            raise ValueError(f"keys {other!r} and {key!r} differ only in case")
        result[key] = value
    return result


class JsonNumber(Decimal):
    """A JSON number with a fraction or exponent: exact, and re-serialised with the very
    digits it was sent with (`1.50` stays `1.50`, not `1.5` or a float's rounding)."""

    text: str

    def __new__(cls, text: str) -> JsonNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def parse_json_body(body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> object:
    """The body as priced: numbers exact (JsonNumber), no NaN/Infinity, no keys that are
    equal or differ only in case, no unpaired surrogate, bounded nesting, at most
    `limits.max_values` values and strings of at most `limits.max_string_length`. An
    empty body is None.

    What a refusal costs is bounded by the bytes: the number of values is bounded
    before parsing by counting separators (bytes.count, at memory speed), the parser is
    the C one, and the one walk after it stops at the first value out of bounds."""
    if not body:
        return None
    if body.count(b",") + body.count(b":") >= limits.max_values:
        raise too_complex(f"more than {limits.max_values} values")
    try:
        document = json.loads(
            body.decode("utf-8"),
            parse_float=JsonNumber,
            parse_constant=_reject_constant,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise Problem(400, "bad_json", f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise Problem(400, "bad_json", f"the body is not valid JSON: {exc}") from exc
    _check_document(document, limits)
    return document


def too_complex(what: str) -> Problem:
    return Problem(
        413,
        "body_too_complex",
        f"the body has {what}: the tenant's request_limits bound what one request may cost",
    )


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _check_document(document: object, limits: RequestLimits) -> None:
    """One walk over the parsed document: nesting, the count of values, each string's
    length, and unpaired surrogates (json.loads joins an escaped pair into its one
    character, so any surrogate left in a string is unpaired)."""
    values = 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > limits.max_values:
            raise too_complex(f"more than {limits.max_values} values")
        if depth > MAX_JSON_DEPTH and isinstance(value, dict | list):
            raise Problem(400, "bad_json", f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            values += len(value)
            for key, item in value.items():
                _check_string(key, limits)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _check_string(value, limits)


def _check_string(text: str, limits: RequestLimits) -> None:
    if len(text) > limits.max_string_length:
        raise too_complex(f"a string longer than {limits.max_string_length} characters")
    if _SURROGATE.search(text) is not None:
        # `\ud800` escapes no character: an upstream reads it as U+FFFD, as itself, or
        # fails (Go, JavaScript, Rust), and it cannot be sent on as UTF-8 at all (an MCP
        # call was reserved, never sent, and left ambiguous and charged).
        raise Problem(
            400,
            "bad_json",
            "the body has an unpaired surrogate escape (\\ud800-\\udfff): not text; send "
            "the character itself, or both halves of its pair",
        )


def hold_id_for(tenant: str, agent: str, route_id: str, agent_key: str) -> str:
    """The hold's id (and, prefixed, the upstream's Idempotency-Key): the same agent
    sending the same key on the same route is the same effect; anything else is not."""
    material = "\x00".join((tenant, agent, route_id, agent_key)).encode()
    return hashlib.sha256(material).hexdigest()[:40]


def upstream_key(hold_id: str) -> str:
    return f"irrev-{hold_id}"


def fingerprint(method: str, path: str, query: str, body: bytes, headers: Headers = ()) -> str:
    """What makes a repeat of a key the same effect. Passed-through headers (an API
    version changes what the upstream does) count; without any, the digest is the one
    of records written before headers were passed."""
    digest = hashlib.sha256()
    parts = [method.encode(), path.encode(), query.encode(), body]
    parts += [f"{name}: {value}".encode() for name, value in headers]
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:40]


class _Record:
    """A record kept with a hold as compact JSON, with its body in base64."""

    body_b64: str

    @property
    def body(self) -> bytes:
        return base64.b64decode(self.body_b64)

    def dumps(self) -> str:
        return json.dumps(self._fields(), separators=(",", ":"))

    def _fields(self) -> dict[str, Any]:
        # The fields as they are: asdict would deep-copy each value first, once per
        # reserve, for the same JSON.
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class StoredRequest(_Record):
    """The effect as admitted, kept with its hold while it is live."""

    agent: str
    tool: str
    method: str
    path: str
    query: str
    content_type: str
    body_b64: str
    route_id: str
    price: int
    # The agent's request headers the tool lets through (lower-case names, sorted), so
    # that a retry or an approval sends the same ones. Never a credential: those are
    # added at each forward and are not the agent's.
    headers: Headers = ()
    # The settlement terms, kept through to the answer (defaults: records from before
    # they were kept, read as strictly as possible: proxied, class unknown).
    face_value: int = 0
    effect_class: str = ""
    in_process: bool = False
    # Held under a key its caller did not send, on a route whose identical calls are
    # each an effect of their own (`dedupe_window: 0`): nothing its caller sends
    # reaches it again, so neither its decision nor what reads the hold later (the
    # escalation's poll) tells the agent to repeat the call to learn its fate.
    alone: bool = False

    def _fields(self) -> dict[str, Any]:
        record = super()._fields()
        if not self.alone:
            # Written only where set: every other record stays as long as before, and
            # readable by a worker of the release before it during an upgrade (its
            # `loads` takes no field it does not know).
            del record["alone"]
        return record

    @classmethod
    def loads(cls, text: str) -> StoredRequest:
        data = json.loads(text)
        data["headers"] = tuple(tuple(h) for h in data.get("headers", ()))
        return cls(**data)

    def answer(
        self,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        keep: frozenset[str] = KEPT_RESPONSE_HEADERS,
        reason: str = "",
    ) -> StoredAnswer:
        """The answer to keep for this effect, with its route and settlement terms;
        `reason`: the gateway's reason code when the answer is its own problem."""
        return StoredAnswer.of(
            self.agent,
            status,
            headers,
            body,
            route_id=self.route_id,
            keep=keep,
            terms=(self.face_value, self.effect_class, self.in_process),
            reason=reason,
        )


@dataclass(frozen=True)
class StoredAnswer(_Record):
    """The upstream's answer to an effect (or the gateway's, for in-process holds),
    kept with the settled hold so that a repeat gets it back without a second effect."""

    agent: str
    status: int
    headers: list[tuple[str, str]]
    body_b64: str
    # The route of the effect, so that a compensation after the request record is
    # gone still knows which route's prices it teaches ('' in records from before).
    route_id: str = ""
    face_value: int = 0
    effect_class: str = ""
    in_process: bool = False
    # The reason code when the answer is the gateway's own problem (nothing was sent,
    # or it was released unreplicated), '' for an upstream's answer: a repeat or a poll
    # marks it X-Irrev-Reason again, as the first answer was (a header kept among the
    # upstream's would be dropped with the tool's own X-Irrev-* ones).
    reason: str = ""

    def without_body(self) -> StoredAnswer | None:
        """This answer as kept past its agent's allowance of kept answer bytes: the
        same status and headers, and instead of the body its notes (BODY_NOTES). None
        for an answer with no body to leave out, or the gateway's own problem, whose
        detail is its body (small, and what a repeat must say)."""
        body = self.body
        if not body or self.reason:
            return None
        return replace(self, headers=[*self.headers, *omitted(body, OVER_ALLOWANCE)], body_b64="")

    def omitted(self) -> dict[str, str]:
        """The notes on a body this answer does not keep (by name), {} if it kept it."""
        return {name: value for name, value in self.headers if name in BODY_NOTES}

    def dumps(self) -> str:
        """Compact, as it is kept with every settled hold for the record's retention:
        one line of JSON with one-letter keys and no defaults (a leading content-type
        header is `c`, its value), then a newline and the body as it came when it is
        UTF-8 text (else base64 under `b`). The JSON line has no newline of its own
        (json.dumps escapes them), so the first one ends it. Half the bytes of the
        long form for a typical answer (issue 12)."""
        head: dict[str, object] = {"a": self.agent, "s": self.status}
        headers = self.headers
        if headers and headers[0][0] == "content-type":
            # Nearly every answer has one, first: its value alone, without the name.
            head["c"], headers = headers[0][1], headers[1:]
        if headers:
            head["h"] = headers
        if self.route_id:
            head["r"] = self.route_id
        if self.face_value:
            head["f"] = self.face_value
        if self.effect_class:
            head["e"] = self.effect_class
        if self.in_process:
            head["p"] = 1
        if self.reason:
            head["g"] = self.reason
        try:
            text = self.body.decode("utf-8")
        except UnicodeDecodeError:
            head["b"], text = self.body_b64, ""
        return json.dumps(head, separators=(",", ":")) + "\n" + text

    @classmethod
    def loads(cls, text: str) -> StoredAnswer:
        """Either form: the compact one (`dumps`), or the long one, one JSON object
        with the field names, that gateways wrote before (issue 12) and that still
        settles holds while old and new gateways share a Redis."""
        line, compact, text = text.partition("\n")
        data = json.loads(line)
        if not compact:
            data["headers"] = [tuple(h) for h in data["headers"]]
            return cls(**data)
        headers = [("content-type", data["c"])] if "c" in data else []
        return cls(
            data["a"],
            data["s"],
            headers + [(name, value) for name, value in data.get("h", ())],
            data["b"] if "b" in data else base64.b64encode(text.encode()).decode(),
            data.get("r", ""),
            data.get("f", 0),
            data.get("e", ""),
            bool(data.get("p", 0)),
            data.get("g", ""),
        )

    @classmethod
    def of(
        cls,
        agent: str,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        route_id: str = "",
        keep: frozenset[str] = KEPT_RESPONSE_HEADERS,
        terms: tuple[int, str, bool] = (0, "", False),
        reason: str = "",
    ) -> StoredAnswer:
        """`terms`: the effect's face value, class and whether it runs in-process;
        `reason`: the gateway's reason code when the answer is its own problem."""
        kept = [(k.lower(), v) for k, v in headers if k.lower() in keep]
        if len(body) > MAX_RECORDED_BODY:
            # Kept with the hold in Redis: a huge body would not fit the record, and a
            # delivered effect must still be posted. A repeat gets the status without it.
            kept += omitted(body, BODY_TOO_LARGE)
            body = b""
        body_b64 = base64.b64encode(body).decode()
        return cls(agent, status, kept, body_b64, route_id, *terms, reason=reason)


def omitted(body: bytes, reason: str) -> list[tuple[str, str]]:
    """The notes a kept answer carries in place of `body` (BODY_NOTES): enough for a
    repeat to say what the answer was, and for the agent to check a copy it kept."""
    digest = hashlib.sha256(body).hexdigest()
    return [(BODY_OMITTED, str(len(body))), (BODY_SHA256, digest), (BODY_OMITTED_REASON, reason)]


def record_of(request: str, outcome: str) -> StoredRequest | StoredAnswer | None:
    """Whichever record a hold still has: its request while it is live, the answer once
    it is settled (the request is dropped then). Both name the agent and the route."""
    if request:
        return StoredRequest.loads(request)
    if outcome:
        return StoredAnswer.loads(outcome)
    return None


def receipt(record: StoredRequest | StoredAnswer) -> str:
    """What a hold settled by hand keeps as its outcome: the upstream's answer where
    there was one, else a 200 made from the stored request."""
    answer = record.answer(200, [], b"") if isinstance(record, StoredRequest) else record
    return answer.dumps()


def owner_of(request: str, outcome: str) -> str:
    """The agent a hold belongs to."""
    record = record_of(request, outcome)
    return record.agent if record else ""
