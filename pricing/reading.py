"""A request as its upstream will read it: the path checked for what a router would
normalise into another route, the query and body fields checked against the route's
declared ones, and the face value, currency and risk factors read from its fields
the one way an upstream could read them."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from decimal import Decimal
from urllib.parse import quote

from ledger.limits import MAX_ID_CHARS
from pricing.errors import (
    AmbiguousField,
    AmountError,
    BadAmount,
    BadQuery,
    BadRiskFactor,
    CurrencyMismatch,
    RequestError,
    UndeclaredField,
    UndeclaredQueryParameter,
    UnsupportedBodyFormat,
)
from pricing.money import MAX_MICROS, product_to_minor, to_decimal
from pricing.policy import BodyFormat
from pricing.templates import FACTOR_PREFIX, FORMAT_EXTENSION, ID_RE, FactorTemplate, split_path

Query = Mapping[str, str | Sequence[str]]
_DIGITS = re.compile(r"[0-9]+")
# A whole value a number parser reads as one number (sign, point, exponent; lower-case).
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?")
# Segments an upstream may normalise into another route than the one that was priced.
_UNSAFE_SEGMENTS = frozenset({"", ".", ".."})
# Unicode categories a reader does not see as such: controls, formatting (bidi
# overrides, zero-width characters), line and paragraph separators.
_UNSHOWN = frozenset({"Cc", "Cf", "Zl", "Zp"})
_UNSAFE_ESCAPES = ("%2f", "%5c", "%2e", "\\")
MEDIA_TYPES = {
    BodyFormat.JSON: "application/json",
    BodyFormat.FORM: "application/x-www-form-urlencoded",
}


# RFC 3986 pchar minus '%' and ';', plus the separator: a decoded path (what was
# priced) goes out with every other character percent-encoded, so '?', '#', '%' or ';'
# in a path parameter stay part of that parameter and cannot turn into a query, a
# fragment, another escape or matrix parameters (which Tomcat strips), i.e. into a
# request other than the one priced.
_PATH_SAFE = "/!$&'()*+,=:@-._~"


def wire_path(path: str) -> str:
    """A decoded path as it goes to the upstream, percent-encoded: what the forward
    sends, and how a person reads it (an unknown route's id, the approval queue's
    request line), so that what they read is what is sent."""
    return quote(path, safe=_PATH_SAFE)


def check_request_path(path: str) -> None:
    """Refuse paths an upstream could normalise into a route other than the one priced."""
    # Tomcat and Spring drop ';params' from a segment before resolving it: '..;' is '..'.
    parts = [p.partition(";")[0] for p in split_path(path)]
    lowered = path.lower()
    if any(p in _UNSAFE_SEGMENTS for p in parts) or any(e in lowered for e in _UNSAFE_ESCAPES):
        raise RequestError(
            f"path {path!r} has empty, '.' or '..' segments or an encoded '/', '\\' or '.'; "
            "send the canonical path"
        )
    if any(unicodedata.category(c) in _UNSHOWN for c in path):
        # An unknown route's id is its path, shown to approvers and printed in the
        # journal: a bidi override shows `/stop` for `/\u202epots`, a carriage return
        # and an escape sequence overwrite a terminal's line with a forged entry.
        raise RequestError(
            f"path {path!r} has control or invisible formatting characters; send the "
            "path without them"
        )


def check_effect_path(path: str) -> None:
    """Effects also refuse ';': matrix parameters that some upstreams strip or route by."""
    if ";" in path:
        raise RequestError(f"path {path!r} contains ';'; effect paths take no matrix parameters")


def check_body_format(expected: BodyFormat, got: BodyFormat | None) -> None:
    if got is not None and got is not expected:
        raise UnsupportedBodyFormat(
            f"this route takes {MEDIA_TYPES[expected]} bodies, not {MEDIA_TYPES[got]}"
        )


def check_effect_query(query: Query, declared: frozenset[str]) -> None:
    """An effect forwards only the query parameters its route declares, each once."""
    for name, values in query.items():
        if name not in declared:
            listed = ", ".join(sorted(declared)) or "none"
            raise UndeclaredQueryParameter(
                name, f"is not a query parameter of this route (it declares: {listed})"
            )
        if not isinstance(values, str) and len(values) != 1:
            raise BadQuery(name, f"appears {len(values)} times in the query; send it once")


def check_effect_body(body: object, declared: frozenset[str]) -> None:
    """A route that declares its body fields forwards those only: a field it does not
    declare (at any depth: `a.b` declares `b` inside `a`, and all of `a.b`'s value) is
    refused, not forwarded unpriced. A route that declares none is left as it is."""
    if declared and isinstance(body, Mapping):
        _check_fields(body, "", declared)


def _check_fields(node: Mapping[object, object], prefix: str, declared: frozenset[str]) -> None:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in declared:
            continue
        if isinstance(value, Mapping) and any(d.startswith(path + ".") for d in declared):
            _check_fields(value, path + ".", declared)
            continue
        listed = ", ".join(sorted(declared))
        raise UndeclaredField(path, f"is not a field of this route (it declares: {listed})")


class RequestFields:
    """Reads named fields from a request's body, query and path parameters."""

    def __init__(
        self,
        body: object,
        query: Query,
        path_params: Mapping[str, str],
        query_fields: frozenset[str],
        tail_param: str | None = None,
    ) -> None:
        self.body = body
        self.query = query
        self.path_params = path_params
        self.query_fields = query_fields
        self.tail_param = tail_param  # the path parameter in the last segment
        self.body_keys = (
            {str(k).casefold() for k in body} if isinstance(body, Mapping) else set[str]()
        )

    def get(self, name: str) -> object:
        """The field's raw value; KeyError if absent; ValueError if ambiguous."""
        folded = name.casefold()
        places = [
            any(p.casefold() == folded for p in self.path_params),
            any(q.casefold() == folded for q in self.query),
            folded.partition(".")[0] in self.body_keys,
        ]
        if sum(places) > 1:
            # An upstream may read the copy that was not priced (Rails merges path,
            # query and body; servlets prefer the query): send each field once.
            raise AmbiguousField(name, "is in more than one of the path, query and body")
        if "." in name and folded in self.body_keys:
            # `{"payment": {"amount": 1}, "payment.amount": 45000}`: priced from the
            # nested one, while lodash's get() and MongoDB's $set read the flat key.
            raise AmbiguousField(name, "is both a key with dots and a nested path in the body")
        if name in self.path_params:
            return self.path_params[name]
        if name in self.query_fields:
            return _single_query_value(self.query, name)
        node = self.body
        for part in name.split("."):
            if not isinstance(node, Mapping):
                raise KeyError(name)
            node = node[part]
        return node


def _single_query_value(query: Query, name: str) -> str:
    value = query[name]
    if isinstance(value, str):
        return value
    values = list(value)
    if len(values) != 1:
        # The upstream may read another copy than the one priced: refuse, do not guess.
        raise ValueError(f"appears {len(values)} times in the query; send it once")
    return values[0]


def read_face_value(
    fields: RequestFields, names: tuple[str, ...], scale: int, amount_scale: int = 1
) -> int:
    factors: list[Decimal] = []
    for name in names:
        try:
            raw = fields.get(name)
        except KeyError:
            raise BadAmount(name, "is missing; the face value needs it") from None
        except RequestError:
            raise
        except ValueError as exc:
            raise BadAmount(name, str(exc)) from None
        try:
            factor = to_decimal(raw)
        except AmountError as exc:
            raise BadAmount(name, str(exc)) from None
        if amount_scale != 1 and factor != factor.to_integral_value():
            raise BadAmount(
                name, f"{raw} must be a whole number of 1/{amount_scale} units (minor units)"
            )
        factors.append(factor)
    try:
        return product_to_minor(factors, scale, amount_scale)
    except AmountError as exc:
        raise BadAmount(" * ".join(names), f"face value {exc}") from None


def check_currency(fields: RequestFields, name: str, currency: str) -> None:
    try:
        raw = fields.get(name)
    except KeyError:
        raise CurrencyMismatch(
            name, f"is missing; this route's amounts need it ({currency})"
        ) from None
    except RequestError:
        raise
    except ValueError as exc:
        raise CurrencyMismatch(name, str(exc)) from None
    if not isinstance(raw, str) or raw.casefold() != currency.casefold():
        raise CurrencyMismatch(name, f"{raw!r} is not the tenant's risk-unit currency {currency!r}")


def read_factors(fields: RequestFields, templates: tuple[FactorTemplate, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for template in templates:
        values = [_factor_value(fields, name) for name in template.fields]
        factor = template.expand(values)
        if not ID_RE.fullmatch(FACTOR_PREFIX + factor):
            raise BadRiskFactor(
                ",".join(template.fields), f"risk factor {factor!r} is longer than 121 characters"
            )
        if factor not in out:
            out.append(factor)
    return tuple(out)


def _factor_value(fields: RequestFields, name: str) -> str:
    try:
        raw = fields.get(name)
    except KeyError:
        raise BadRiskFactor(name, "is missing; the route's risk factor needs it") from None
    except RequestError:
        raise
    except ValueError as exc:
        raise BadRiskFactor(name, str(exc)) from None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise BadRiskFactor(name, f"must be a string or an integer, not {type(raw).__name__}")
    if isinstance(raw, int) and abs(raw) > MAX_MICROS:
        # A JSON integer past 2^53 reads as another number in a parser that uses doubles
        # (JavaScript's): 2^60 and 2^60 + 1 would be one supplier upstream and two
        # factor accounts here.
        raise BadRiskFactor(name, f"{raw} is past 2^53 - 1; send an id that long as a string")
    if isinstance(raw, str) and name == fields.tail_param:
        # `/stock/77.json` is item 77 to a router that strips a format extension.
        raw = FORMAT_EXTENSION.sub("", raw)
    # Case-folded so that 'Acme-Steel' and 'acme-steel' share one factor account, and a
    # number spelled one way only, so that '042', '42.0' and '4.2e1' do (an API that
    # reads ids as numbers reads one customer): an agent must not dodge a concentration
    # cap by spelling; merging only tightens.
    value = _one_spelling(name, str(raw).strip().lower())
    if not ID_RE.fullmatch(value):
        raise BadRiskFactor(name, f"{raw!r} may use only letters, digits and . _ : @ / -")
    return value


def _one_spelling(name: str, value: str) -> str:
    """A factor value that reads as one number, as that number's plain decimal: digits
    without leading zeros, a point only before a fraction's digits; anything else as
    it is."""
    if _DIGITS.fullmatch(value):
        return value.lstrip("0") or "0"  # any length: a long id of digits stays one
    if not _NUMBER.fullmatch(value):
        return value
    number = Decimal(value)
    if number.is_zero():
        return "0"
    # Past an id's length its digits cannot be an id, and printing 1e999999 in full
    # would cost the gateway.
    if not -MAX_ID_CHARS <= number.adjusted() <= MAX_ID_CHARS:
        raise BadRiskFactor(name, f"{value!r} is a number too large or too small for an id")
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")
