"""Canonical forwarding: the request the gateway forwards is re-encoded from what it
priced, never the agent's bytes, and anything another parser could read differently
is refused first (issue 10's parser differentials).

- The Content-Type is an exact allow-list parsed as a media type: `application/json`
  or `application/x-www-form-urlencoded`, with at most `charset=utf-8`; forwarded bare.
- JSON bodies: strict (wire.parse_json_body), re-serialised with sorted keys, no
  whitespace, every number's digits as sent, and `&`, `=`, `;` in strings escaped,
  so a server that sniffs a form in any body finds no pair in it.
- Form bodies: percent-encoded ASCII only, no `;`, every pair `name=value`, escapes
  decoded once into valid UTF-8, every name a plain name with closed `[index]` groups,
  no two names that PHP, Rails or a case-insensitive reader would merge; re-encoded
  sorted, every byte outside `A-Za-z0-9-._~` escaped.
- The query: no `;`, escapes decoded once, re-encoded the same way. Which parameters
  an effect may carry is the route's business (pricing.catalog).
- Method overrides (`_method`, `X-HTTP-Method-Override` and the like) as a header,
  a query parameter or a top-level body field are refused on every route, reads
  included: a server that honours them would run another method than the one priced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from gateway.edge.problems import Problem
from gateway.edge.wire import DEFAULT_LIMITS, JsonNumber, parse_json_body, too_complex
from pricing import MEDIA_TYPES, METHOD_OVERRIDE_HEADERS, BodyFormat, RequestLimits

# As a query parameter or body field too; `_method` is Laravel's, Symfony's and Rails'.
METHOD_OVERRIDES = METHOD_OVERRIDE_HEADERS | {"_method"}
_FORMATS = {media: fmt for fmt, media in MEDIA_TYPES.items()}
_CHARSET = re.compile(r'charset=("utf-8"|utf-8)', re.IGNORECASE)
# RFC 3986 unreserved and sub-delims but ';', '%' escapes, '+', the separators, and
# the brackets of nested names (`metadata[k]`, as Rails, PHP and Stripe send them).
_FORM_TEXT = re.compile(rb"[A-Za-z0-9._~!$'()*,:@/?+=&%\[\]-]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UNRESERVED = "-._~"
_ENCODED_SEPARATOR = re.compile(rb"%(2f|5c)", re.IGNORECASE)
# A form field's name: a base, then closed `[index]` groups (Stripe's `metadata[k]`).
# Other names are read as another field by some server: PHP drops leading spaces, cuts
# a name at a NUL and reads an unclosed '[' as '_' (`customer[id` is `customer_id`);
# Rack 2 drops the brackets around a name (`[amount]` is `amount`).
_FORM_NAME = re.compile(r"[^\[\]\x00-\x20\x7f][^\[\]\x00-\x1f\x7f]*(\[[^\[\]\x00-\x1f\x7f]*\])*")
_FORM_SEPARATORS = str.maketrans({"&": "\\u0026", "=": "\\u003d", ";": "\\u003b"})
Pair = tuple[str, str | None]
# Numbers are hashed plain within 10**+-40, the range pricing reads amounts in
# (pricing.money.MAX_EXPONENT), so that an amount sent as an integer and the same value
# with an exponent are one call. Fixed here: changing it changes holds' fingerprints.
PLAIN_EXPONENT = 40


def body_format_of(content_types: list[str]) -> BodyFormat:
    """The body's format from its one Content-Type header, or 415."""
    allowed = " or ".join(MEDIA_TYPES.values())
    if len(content_types) != 1:
        raise Problem(415, "unsupported_media_type", f"send one Content-Type: {allowed}")
    media, *params = (part.strip() for part in content_types[0].split(";"))
    found = _FORMATS.get(media.lower())
    if found is None or len(params) > 1 or not all(_CHARSET.fullmatch(p) for p in params):
        raise Problem(
            415,
            "unsupported_media_type",
            f"Content-Type {content_types[0]!r} is not accepted: send {allowed}, with at "
            "most 'charset=utf-8'",
        )
    return found


def _decode(text: str, reason: str) -> str:
    if _BAD_ESCAPE.search(text):
        raise Problem(400, reason, f"{text[:40]!r}: '%' must start an escape like %2F")
    try:
        return unquote_to_bytes(text.replace("+", " ")).decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(400, reason, f"{text[:40]!r} does not decode to UTF-8") from None


def _check_override(name: str, where: str) -> None:
    if name.casefold() in METHOD_OVERRIDES:
        raise Problem(
            400,
            "method_override",
            f"{name!r} in the {where} would make some servers run another method than the "
            "one priced; send the method itself",
        )


def check_headers(names: Iterable[str]) -> None:
    """Refuse method-override headers, whether or not they would be passed on; CGI-style
    servers read `X_HTTP_Method_Override` as `X-HTTP-Method-Override`."""
    for name in names:
        _check_override(name.replace("_", "-"), "headers")


def parse_query(query: str) -> list[Pair]:
    """The query's pairs, decoded once (a name without '=' has the value None)."""
    if not query:
        return []
    if ";" in query:
        raise Problem(
            400, "bad_query", "';' in the query: some servers split parameters on it; send %3B"
        )
    pairs: list[Pair] = []
    for part in query.split("&"):
        if not part:
            raise Problem(400, "bad_query", "an empty query parameter (a stray '&')")
        name, sep, value = part.partition("=")
        decoded = _decode(name, "bad_query")
        _check_override(decoded, "query")
        pairs.append((decoded, _decode(value, "bad_query") if sep else None))
    return pairs


def _form_key(name: str) -> str:
    # PHP reads ' ' and '.' in a name as '_', and names case-insensitively match in
    # many frameworks: names equal after this are one field to someone.
    return name.casefold().replace(" ", "_").replace(".", "_")


def parse_form(body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> dict[str, str]:
    """A strict application/x-www-form-urlencoded body, of at most `limits.max_values`
    fields (counted on the bytes first) of at most `limits.max_string_length`."""
    if body.count(b"&") >= limits.max_values:
        raise too_complex(f"more than {limits.max_values} fields")
    if not _FORM_TEXT.fullmatch(body):
        raise Problem(
            400,
            "bad_form",
            "a form body is percent-encoded ASCII without ';' or spaces; escape other bytes",
        )
    fields: dict[str, str] = {}
    keys: set[str] = set()
    for pair in body.decode("ascii").split("&"):
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise Problem(400, "bad_form", f"{pair[:40]!r} is not a 'name=value' pair")
        decoded = _decode(name, "bad_form")
        if not _FORM_NAME.fullmatch(decoded):
            raise Problem(
                400,
                "bad_form",
                f"field name {decoded[:40]!r}: send a plain name, optionally with closed "
                "'[index]' groups, without control characters or a leading space",
            )
        _check_override(decoded, "body")
        key = _form_key(decoded)
        if key in keys:
            raise Problem(400, "bad_form", f"field {decoded!r} is given twice (or in two cases)")
        keys.add(key)
        fields[decoded] = _decode(value, "bad_form")
        if len(fields[decoded]) > limits.max_string_length:
            raise too_complex(f"a field longer than {limits.max_string_length} characters")
    for key in keys:
        # `amount` and `amount[]` (or `amount[x]`) are one field to PHP and Rails.
        if "[" in key and key.partition("[")[0] in keys:
            raise Problem(400, "bad_form", f"field {key!r} and {key.partition('[')[0]!r} collide")
    return fields


def _quote(text: str) -> str:
    return quote(text, safe=_UNRESERVED)


def encode_pairs(pairs: Iterable[Pair]) -> str:
    """Sorted by name (stable), every byte outside `A-Za-z0-9-._~` percent-encoded."""
    return "&".join(
        _quote(name) if value is None else f"{_quote(name)}={_quote(value)}"
        for name, value in sorted(pairs, key=lambda pair: pair[0])
    )


def dump_json(value: object, *, by_value: bool = False) -> str:
    """Compact JSON, keys sorted, numbers with their digits as parsed; `by_value`: each
    number in its one spelling (`_number_by_value`), for telling a repeat from a new
    call, never for forwarding."""
    if isinstance(value, dict):
        pairs = (
            f"{_string(k)}:{dump_json(v, by_value=by_value)}" for k, v in sorted(value.items())
        )
        return "{" + ",".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump_json(v, by_value=by_value) for v in value) + "]"
    if isinstance(value, JsonNumber):
        return _number_by_value(value) if by_value else value.text
    if isinstance(value, str):
        return _string(value)
    return json.dumps(value)


def _number_by_value(number: JsonNumber) -> str:
    """One spelling per value: an integral value as an integer's digits (as json.loads
    reads a number without a fraction or exponent, so `10.0` and `1e1` read as `10`),
    any other as its plain decimal without trailing zeros (`1.50` as `1.5`), -0 as 0.
    A spelling already so keeps its digits, so its body hashes as it always did.
    Outside 10**+-PLAIN_EXPONENT the digits and an exponent instead (`1e41`): a plain
    1e999999999 would be a gigabyte, and no plain spelling has an 'e' to collide with."""
    sign, digit_tuple, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # parse_json_body admits finite numbers only
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    if not digits:
        return "0"
    exponent += len(digit_tuple) - len(digits)
    minus = "-" if sign else ""
    if not -PLAIN_EXPONENT <= exponent + len(digits) - 1 <= PLAIN_EXPONENT:
        return f"{minus}{digits}e{exponent}"
    if exponent >= 0:
        return minus + digits + "0" * exponent
    point = len(digits) + exponent
    if point > 0:
        return f"{minus}{digits[:point]}.{digits[point:]}"
    return f"{minus}0.{'0' * -point}{digits}"


def _string(text: str) -> str:
    return json.dumps(text).translate(_FORM_SEPARATORS)


def check_raw_path(raw_path: bytes) -> None:
    """An encoded '/' or '\\' is one segment to the gateway (which decodes the path
    once) and two to an upstream that decodes again or routes on the raw path."""
    if _ENCODED_SEPARATOR.search(raw_path):
        raise Problem(422, "bad_request", "the path has an encoded '/' or '\\'; send the path")


@dataclass(frozen=True)
class Canonical:
    """A request as priced, and as it is forwarded."""

    query: tuple[Pair, ...]
    body_format: BodyFormat | None
    document: object  # JSON value, a form's fields, or None without a body

    @property
    def query_map(self) -> dict[str, list[str]]:
        """The query as pricing reads it (a bare name reads as '')."""
        found: dict[str, list[str]] = {}
        for name, value in self.query:
            found.setdefault(name, []).append(value or "")
        return found

    @property
    def query_text(self) -> str:
        return encode_pairs(self.query)

    @property
    def content_type(self) -> str:
        return MEDIA_TYPES[self.body_format] if self.body_format else ""

    @property
    def body(self) -> bytes:
        if self.body_format is BodyFormat.FORM:
            assert isinstance(self.document, dict)
            return encode_pairs(self.document.items()).encode("ascii")
        if self.body_format is BodyFormat.JSON:
            return dump_json(self.document).encode("ascii")
        return b""

    @property
    def fingerprint_body(self) -> bytes:
        """The body as a repeat is told from a new effect by: as forwarded, but with
        each JSON number in one spelling per value (10, 10.0 and 1e1 are one call)."""
        if self.body_format is BodyFormat.JSON:
            return dump_json(self.document, by_value=True).encode("ascii")
        return self.body


def read_request(
    query: str, content_types: list[str], body: bytes, limits: RequestLimits = DEFAULT_LIMITS
) -> Canonical:
    """Parse a request's query and body strictly, within `limits`; raise a Problem for
    what could be read two ways."""
    pairs = tuple(parse_query(query))
    if not body:
        return Canonical(pairs, None, None)
    body_format = body_format_of(content_types)
    if body_format is BodyFormat.FORM:
        return Canonical(pairs, body_format, parse_form(body, limits))
    document = parse_json_body(body, limits)
    if isinstance(document, dict):
        for key in document:
            _check_override(key, "body")
    return Canonical(pairs, body_format, document)
