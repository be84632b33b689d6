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
from gateway.edge.wire import fingerprint, parse_json_body
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


@pytest.mark.parametrize(
    ("spellings", "by_value"),
    [
        (["10", "10.0", "1e1", "1E+1", "10.000e0", "0.1e2", "100e-1"], "10"),
        (["1.50", "1.5", "15e-1", "0.15E1"], "1.5"),
        (["-0", "0", "-0.0", "0.0", "0e7", "-0E-7"], "0"),
        (["0.001", "1e-3", "0.00100"], "0.001"),
        (["-2.50", "-25e-1"], "-2.5"),
        (["123.456", "1.23456e2"], "123.456"),
        (["10000000000000000000001", "1.0000000000000000000001e22"], "1" + "0" * 21 + "1"),
        # Plain within pricing's amount range (10**+-40), so an integer sent with
        # digits and the same value with an exponent are one call there.
        (["1" + "0" * 40, "1e40", "10e39"], "1" + "0" * 40),
        (["0." + "0" * 39 + "1", "1e-40"], "0." + "0" * 39 + "1"),
        # Beyond it the digits and an exponent: writing 1e999999999 out would take a
        # gigabyte. No plain spelling has an 'e', so no two values collide.
        (["1e41", "10e40", "1.0e41"], "1e41"),
        (["1e999999999", "10e999999998", "1.00E+999999999"], "1e999999999"),
        (["-2.50e-999999999", "-25e-1000000000"], "-25e-1000000000"),
    ],
)
def test_the_fingerprint_reads_each_number_by_value(spellings: list[str], by_value: str) -> None:
    """10, 10.0 and 1e1 are one number to JSON Schema and to the SDK's server: one
    spelling each in what tells a repeat from a new call. What is forwarded keeps the
    digits as sent (test_json_keeps_every_digit)."""
    for spelling in spellings:
        document = parse_json_body(f'{{"n":[{spelling}]}}'.encode())
        assert dump_json(document, by_value=True) == f'{{"n":[{by_value}]}}', spelling


def test_a_canonically_spelled_body_keeps_its_fingerprint() -> None:
    """A hold in flight across a rolling upgrade keeps its fingerprint: a body whose
    numbers are already spelled one way per value hashes as before. The digest is the
    one the gateway computed before numbers were read by value (pinned)."""
    body = b'{"b":[1.5,-0.25,0.001,10,-3,0,12345678901234567890123],"a":"x"}'
    canonical = read_request("", ["application/json"], body)
    assert canonical.fingerprint_body == canonical.body
    pinned = "737b91c043979104b5c0b0bd4a1446ab1a883c2f"
    assert fingerprint("POST", "/v1/orders", "", canonical.fingerprint_body) == pinned
    respelled = body.replace(b"1.5,", b"1.50,").replace(b",10,", b",1e1,")
    again = read_request("", ["application/json"], respelled)
    assert again.body != canonical.body  # forwarded as sent
    assert again.fingerprint_body == canonical.body


def test_a_form_body_is_its_own_fingerprint() -> None:
    """A form's values are strings: '10' and '10.0' there are the upstream's to read."""
    canonical = read_request("", [FORM], b"amount=10.0")
    assert canonical.fingerprint_body == canonical.body == b"amount=10.0"


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


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_a_number_by_value_is_its_own_spelling(number: Decimal) -> None:
    """The spelling by value reads back as the same value, and is a fixed point both
    as forwarded and by value: so a body spelled that way hashes as it always did."""
    spelled = dump_json(parse_json_body(str(number).encode()), by_value=True)
    again = parse_json_body(spelled.encode())
    assert again == number
    assert dump_json(again) == spelled
    assert dump_json(again, by_value=True) == spelled
