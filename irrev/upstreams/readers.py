"""An upstream that executes nothing and reports, for every request it receives, how
several real-world parsers would read it: the method, the route (path) and the fields.

The gateway prices a request with one reading; the tool API behind it may use
another. Each reader here is one way real servers differ:

- `strict`: the declared Content-Type, exact JSON keys, `&`-separated query, body
  fields over query fields (Rails, Laravel's `input()`).
- `servlet`: the same, but query parameters win over the body (Java servlets' and
  Spring's `getParameter`).
- `go_json`: JSON keys matched case-insensitively, the last match winning (Go's
  encoding/json), a Unicode fold (U+017F, the long s, is `s`; the Kelvin sign is `k`).
- `first_key_json`: of duplicate JSON keys, the first wins (some streaming parsers).
- `semicolon_query`: `;` separates query parameters like `&` (Python before 3.9.2,
  old Tomcat, many proxies), query over body.
- `method_override`: `X-HTTP-Method-Override`, or `_method` in the query or the body
  (Rack, Laravel/Symfony, Express's method-override) replaces the method.
- `tomcat_path`: `;params` stripped from every segment, then dot segments resolved
  (`..;` is `..`), percent-escapes (an encoded `/` too) decoded first.
- `lenient_routing`: case-insensitive routes, a format extension (everything from
  the last segment's first '.': Rails' formats, Spring's suffix patterns) and a
  trailing slash ignored (IIS, Rails, Spring).
- `sniff_form`: the body read as a form whatever the declared type (its pairs over
  the declared reading).
- `php`: form and query names as PHP registers them: leading spaces dropped, a name
  cut at a NUL, ' ' and '.' read as '_', an unclosed '[' as '_' (`customer[id` is
  `customer_id`), `name[index]` an array under `name`; body over query.
- `rack2`: form names as Rack 2 nests them: brackets around a name dropped
  (`[amount]` and `amount]` are `amount`); body over query.

`Readers` is an ASGI app that records per book (a tenant's upstream prefix) and
lists the records at `GET {prefix}/_readings/{book}`, each reading with the `amount`
a lenient number parser makes of its `amount` field; effects answer 201, reads 200.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote

from starlette.types import Receive, Scope, Send

FORM = "application/x-www-form-urlencoded"
OVERRIDE_HEADER = "x-http-method-override"
_NUMBER_PREFIX = re.compile(r"\s*\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_FORMAT_SUFFIX = re.compile(r"\..*$")
_RACK2_NAME = re.compile(r"[\[\]]*([^\[\]]+)\]*")
Fields = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Received:
    method: str
    path: str  # raw (percent-encoded), below the book
    query: str
    content_type: str
    override: str
    body: bytes


@dataclass(frozen=True)
class Reading:
    method: str
    path: str
    fields: Fields


def number(value: object) -> Decimal | None:
    """What a lenient number parser (JS parseFloat, PHP's cast) makes of a field."""
    if value is None or isinstance(value, bool | dict | list):
        return None
    match = _NUMBER_PREFIX.match(str(value))
    if match is None:
        return None
    try:
        return Decimal(match.group(0).strip().lstrip("+"))
    except InvalidOperation:
        return None


def pairs(text: str, separators: str = "&") -> list[tuple[str, str]]:
    out = []
    for part in re.split(f"[{re.escape(separators)}]", text):
        if part:
            name, _, value = part.partition("=")
            out.append((unquote(name.replace("+", " ")), unquote(value.replace("+", " "))))
    return out


def _json(body: bytes, hook: Callable[[list[tuple[str, Any]]], Fields]) -> Fields:
    try:
        document = json.loads(
            body.decode("utf-8", "replace"), parse_float=str, parse_int=str, object_pairs_hook=hook
        )
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def _last(found: list[tuple[str, Any]]) -> Fields:
    return dict(found)


def _first(found: list[tuple[str, Any]]) -> Fields:
    out: Fields = {}
    for key, value in found:
        out.setdefault(key, value)
    return out


def _folded(found: list[tuple[str, Any]]) -> Fields:
    return {key.casefold(): value for key, value in found}


def _body(r: Received, hook: Callable[[list[tuple[str, Any]]], Fields] = _last) -> Fields:
    media = r.content_type.split(";")[0].strip().lower()
    if media == FORM:
        return dict(pairs(r.body.decode("utf-8", "replace")))
    if "json" in media:
        return _json(r.body, hook)
    return {}


def _query(r: Received, separators: str = "&") -> Fields:
    return dict(pairs(r.query, separators))


def _decoded(path: str) -> str:
    return unquote(path)


def _tomcat(path: str) -> str:
    out: list[str] = []
    for segment in unquote(path).split("/")[1:]:
        segment = segment.split(";")[0]
        if segment == "..":
            if out:
                out.pop()
        elif segment not in (".", ""):
            out.append(segment)
    return "/" + "/".join(out)


def _lenient(path: str) -> str:
    segments = [s.split(";")[0] for s in unquote(path).casefold().rstrip("/").split("/")]
    segments[-1] = _FORMAT_SUFFIX.sub("", segments[-1])
    return "/".join(segments) or "/"


def _php_name(name: str) -> tuple[str, str | None]:
    """(name, index of `name[index]` or None) as PHP registers a field."""
    name = name.lstrip(" ").partition("\x00")[0]
    base, bracket, rest = name.partition("[")
    base = base.replace(" ", "_").replace(".", "_")
    if not bracket:
        return base, None
    index, closed, _ = rest.partition("]")
    if not closed:
        return f"{base}_{rest}", None
    return base, index


def _rack2_name(name: str) -> tuple[str, str | None]:
    match = _RACK2_NAME.match(name)
    if match is None:
        return "", None
    return match.group(1), name[match.end() :] or None


def _nested(text: str, naming: Callable[[str], tuple[str, str | None]]) -> Fields:
    """Form pairs named as a framework names them; `name[index]` nests under `name`."""
    out: Fields = {}
    for name, value in pairs(text):
        key, index = naming(name)
        if index is None:
            out[key] = value
        else:
            nested = out.get(key)
            out[key] = {**(nested if isinstance(nested, dict) else {}), index: value}
    return out


def _framework(r: Received, naming: Callable[[str], tuple[str, str | None]]) -> Fields:
    media = r.content_type.split(";")[0].strip().lower()
    body = _nested(r.body.decode("utf-8", "replace"), naming) if media == FORM else _body(r)
    return {**_nested(r.query, naming), **body}


def _override(r: Received) -> str:
    if r.override:
        return r.override.upper()
    for source in (_query(r, "&;"), _body(r), dict(pairs(r.body.decode("utf-8", "replace")))):
        value = source.get("_method")
        if isinstance(value, str) and value:
            return value.upper()
    return r.method


READERS: dict[str, Callable[[Received], Reading]] = {
    "strict": lambda r: Reading(r.method, _decoded(r.path), {**_query(r), **_body(r)}),
    "servlet": lambda r: Reading(r.method, _decoded(r.path), {**_body(r), **_query(r)}),
    "go_json": lambda r: Reading(r.method, _decoded(r.path), {**_query(r), **_body(r, _folded)}),
    "first_key_json": lambda r: Reading(
        r.method, _decoded(r.path), {**_query(r), **_body(r, _first)}
    ),
    "semicolon_query": lambda r: Reading(
        r.method, _decoded(r.path), {**_body(r), **_query(r, "&;")}
    ),
    "method_override": lambda r: Reading(_override(r), _decoded(r.path), {**_query(r), **_body(r)}),
    "tomcat_path": lambda r: Reading(r.method, _tomcat(r.path), {**_query(r), **_body(r)}),
    "lenient_routing": lambda r: Reading(r.method, _lenient(r.path), {**_query(r), **_body(r)}),
    "sniff_form": lambda r: Reading(
        r.method,
        _decoded(r.path),
        {**_query(r), **_body(r), **dict(pairs(r.body.decode("utf-8", "replace")))},
    ),
    "php": lambda r: Reading(r.method, _decoded(r.path), _framework(r, _php_name)),
    "rack2": lambda r: Reading(r.method, _decoded(r.path), _framework(r, _rack2_name)),
}


def read_all(received: Received) -> dict[str, Reading]:
    return {name: reader(received) for name, reader in READERS.items()}


class Readers:
    """Records every request below `{prefix}/{book}/` with its readings."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.books: dict[str, list[dict[str, Any]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        rest = raw.removeprefix(self.prefix).lstrip("/")
        book, _, path = rest.partition("/")
        if book == "_readings" and scope["method"] == "GET":
            await _reply(send, 200, self.books.get(path, []))
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        received = Received(
            method=scope["method"],
            path="/" + path,
            query=scope.get("query_string", b"").decode("latin-1"),
            content_type=headers.get("content-type", ""),
            override=headers.get(OVERRIDE_HEADER, ""),
            body=body,
        )
        self.books.setdefault(book, []).append(
            {
                "method": received.method,
                "path": received.path,
                "query": received.query,
                "content_type": received.content_type,
                "body": body.decode("latin-1"),
                "key": headers.get("idempotency-key", ""),
                "readings": {
                    name: {
                        "method": r.method,
                        "path": r.path,
                        "fields": r.fields,
                        "amount": _text(number(r.fields.get("amount"))),
                    }
                    for name, r in read_all(received).items()
                },
            }
        )
        await _reply(send, 200 if scope["method"] == "GET" else 201, {"received": True})


def _text(amount: Decimal | None) -> str | None:
    return None if amount is None else str(amount)


async def _reply(send: Send, status: int, payload: object) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
