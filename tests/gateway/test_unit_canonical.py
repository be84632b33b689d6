"""Canonical forwarding, without processes: strict parsing of content types, JSON,
form bodies and queries, and re-encoding that parses back to what was priced
(parse -> canonicalise -> parse is a fixed point)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.edge.canonical import (
    body_format_of,
    dump_json,
    encode_pairs,
    parse_form,
    parse_query,
    read_request,
)
from gateway.edge.problems import Problem
from gateway.edge.wire import parse_json_body
from pricing.policy import BodyFormat

FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("application/json", BodyFormat.JSON),
        ("Application/JSON; charset=UTF-8", BodyFormat.JSON),
        ('application/json;charset="utf-8"', BodyFormat.JSON),
        (FORM, BodyFormat.FORM),
        (f"{FORM}; charset=utf-8", BodyFormat.FORM),
    ],
)
def test_allowed_content_types(header: str, expected: BodyFormat) -> None:
    assert body_format_of([header]) is expected


@pytest.mark.parametrize(
    "headers",
    [
        [f"{FORM}; profile=json"],
        ["text/json"],
        ["application/json; x=1"],
        ["application/json; charset=latin-1"],
        ["application/json;"],
        ["application/json; charset=utf-8; charset=utf-8"],
        ["application/merge-patch+json"],
        ["application/json", "application/json"],
        [],
    ],
)
def test_every_other_content_type_is_415(headers: list[str]) -> None:
    with pytest.raises(Problem) as info:
        body_format_of(headers)
    assert (info.value.status, info.value.reason) == (415, "unsupported_media_type")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"amount":1,"Amount":2}', "bad_json"),
        (b'{"a":{"k":1,"K":2}}', "bad_json"),
        (b'[{"x":1,"X":1}]', "bad_json"),
        (b'{"\\u0041":1,"a":2}', "bad_json"),
        (b'{"amount":1,"_METHOD":"DELETE"}', "method_override"),
    ],
)
def test_json_keys_that_collide_or_override_are_refused(body: bytes, reason: str) -> None:
    with pytest.raises(Problem) as info:
        read_request("", ["application/json"], body)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "body",
    [
        b"a=1;b=2",
        b"a=1&&b=2",
        b"a=1&",
        b"a",
        b"=1",
        b"a=%zz",
        b"a=%ff",
        b"a=1 b",
        "a=\u00e9".encode(),
        b"a=1&A=2",
        b"unit.price=1&unit_price=2",
        b"a=1&a[]=2",
        b"a[]=1&a[]=2",
    ],
)
def test_strict_form_bodies(body: bytes) -> None:
    with pytest.raises(Problem) as info:
        parse_form(body)
    assert (info.value.status, info.value.reason) == (400, "bad_form")


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("a=1;b=2", "bad_query"),
        ("a=1&&b=2", "bad_query"),
        ("a=%2", "bad_query"),
        ("_method=DELETE", "method_override"),
        ("X-HTTP-Method-Override=PUT", "method_override"),
        ("%5Fmethod=DELETE", "method_override"),
    ],
)
def test_strict_queries(query: str, reason: str) -> None:
    with pytest.raises(Problem) as info:
        parse_query(query)
    assert info.value.reason == reason


def test_form_and_query_decode_once_and_reencode_every_reserved_byte() -> None:
    fields = parse_form(b"note=a%2Bb+c%252F&amount=10.50&meta[k]=1&meta[j]=2")
    assert fields == {"note": "a+b c%2F", "amount": "10.50", "meta[k]": "1", "meta[j]": "2"}
    assert encode_pairs(fields.items()) == (
        "amount=10.50&meta%5Bj%5D=2&meta%5Bk%5D=1&note=a%2Bb%20c%252F"
    )
    assert parse_query("flag&b=%3B") == [("flag", None), ("b", ";")]
    assert encode_pairs(parse_query("flag&b=%3B")) == "b=%3B&flag"


def test_json_keeps_every_digit() -> None:
    text = b'{"b": [1.50, 1e2, -0.0, 10000000000000000000001, 0.1], "a": "\\u00e9"}'
    assert dump_json(parse_json_body(text)) == (
        '{"a":"\\u00e9","b":[1.50,1e2,-0.0,10000000000000000000001,0.1]}'
    )


# -- parse -> canonicalise -> parse is a fixed point ----------------------------------

names = st.text(st.characters(codec="utf-8", exclude_characters="[]"), min_size=1, max_size=8)
values = st.text(st.characters(codec="utf-8"), max_size=12)
# Control characters (a general category: the Literal hypothesis types them by).
CONTROL: tuple[Literal["Cc"]] = ("Cc",)
# Form names without what PHP strips or cuts at (a leading space, control characters).
form_names = st.text(
    st.characters(codec="utf-8", exclude_characters="[]", exclude_categories=CONTROL),
    min_size=1,
    max_size=8,
).filter(lambda name: not name.startswith(" "))


def _form_key(name: str) -> str:
    return name.casefold().replace(" ", "_").replace(".", "_")


@given(st.dictionaries(form_names, values, max_size=6))
def test_form_fixed_point(fields: dict[str, str]) -> None:
    keys = [_form_key(n) for n in fields]
    if len(set(keys)) != len(keys) or any(n.casefold() == "_method" for n in fields):
        with pytest.raises(Problem):
            parse_form(encode_pairs(fields.items()).encode())
        return
    if not fields:
        return
    encoded = encode_pairs(fields.items())
    assert parse_form(encoded.encode()) == fields
    assert encode_pairs(parse_form(encoded.encode()).items()) == encoded


@given(st.lists(st.tuples(names, st.one_of(st.none(), values)), max_size=6))
def test_query_fixed_point(pairs: list[tuple[str, str | None]]) -> None:
    if any(n.casefold() in ("_method", "x-http-method-override") for n, _ in pairs):
        return
    encoded = encode_pairs(pairs)
    assert sorted(parse_query(encoded), key=lambda p: p[0]) == sorted(pairs, key=lambda p: p[0])
    assert encode_pairs(parse_query(encoded)) == encoded


numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
)
documents: Any = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, values),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)


def _raw_json(value: Any) -> str:
    """JSON text with numbers written as given (strings of decimals stay numbers)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} : {_raw_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[ " + " , ".join(_raw_json(v) for v in value) + " ]"
    if isinstance(value, str) and _is_number(value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _is_number(text: str) -> bool:
    try:
        return Decimal(text).is_finite() and text[:1] in "-0123456789"
    except ArithmeticError:
        return False


@given(documents)
def test_json_fixed_point(document: Any) -> None:
    raw = _raw_json(document).encode()
    try:
        parsed = parse_json_body(raw)
    except Problem:
        return  # keys that differ only in case: refused, never forwarded
    canonical = dump_json(parsed).encode()
    again = parse_json_body(canonical)
    assert again == parsed
    assert dump_json(again).encode() == canonical
