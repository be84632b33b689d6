"""What pricing refuses so that an upstream cannot read a request as another effect:
undeclared or repeated query parameters on effects, a field in two places, ';' and
dot segments in effect paths, aliases of listed routes, the other body format; and
amounts in minor units of a named currency, converted exactly."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pricing import AmountError, EffectClass, RequestError, load_policy_data, price_request
from pricing.errors import (
    AmbiguousField,
    BadAmount,
    BadQuery,
    CurrencyMismatch,
    RouteAlias,
    UndeclaredQueryParameter,
    UnknownRoute,
    UnsupportedBodyFormat,
)
from pricing.money import major_to_minor, product_to_minor, to_decimal
from pricing.policy import BodyFormat

DOCUMENT: dict[str, Any] = {
    "tenant": "t1",
    "risk_unit": {"currency": "USD", "scale": 1_000_000},
    "window": "24h",
    "escalation_ttl": "15m",
    "hold_ttl": "5m",
    "unknown_routes": {"action": "price_as_irreversible", "face_value": "amount"},
    "accounts": {
        "tenant": {"limit": "1000"},
        "principals": {"ops": {"limit": "500"}},
        "risk_factors": {"order:*": {"limit": "300"}},
    },
    "tools": {"pay": {"upstream": "http://127.0.0.1:9000"}},
    "routes": [
        {
            "tool": "pay",
            "route": "POST /charges",
            "class": "irreversible",
            "body_format": "form",
            "body": ["amount", "currency"],
            "face_value": "amount",
            "amount_scale": 100,
            "currency_field": "currency",
        },
        {
            "tool": "pay",
            "route": "POST /transfers",
            "class": "irreversible",
            "query": ["amount"],
            "face_value": "amount",
        },
        {
            "tool": "pay",
            "route": "POST /orders/{order_id}/fee",
            "class": "irreversible",
            "body": ["fee"],
            "face_value": "fee",
            "risk_factors": ["order:{order_id}"],
        },
        {"tool": "pay", "route": "GET /orders/{order_id}", "class": "read"},
    ],
}
POLICY = load_policy_data(DOCUMENT, "t1.yaml")


def charge(amount: str, currency: str = "usd", fmt: BodyFormat = BodyFormat.FORM) -> int:
    body = {"amount": amount, "currency": currency}
    return price_request(POLICY, "pay", "POST", "/charges", {}, body, fmt).face_value_micros


@given(st.integers(min_value=0, max_value=9 * 10**10))
def test_minor_units_convert_exactly(cents: int) -> None:
    assert charge(str(cents)) == cents * 10**4


@pytest.mark.parametrize(
    ("amount", "currency", "error", "message"),
    [
        ("10.5", "usd", BadAmount, "whole number of 1/100"),
        ("1050", "eur", CurrencyMismatch, "'eur' is not the tenant's risk-unit currency"),
        ("1050", " usd", CurrencyMismatch, "is not the tenant's"),
        ("1e3", "usd", BadAmount, "plain non-negative decimal"),
    ],
)
def test_minor_unit_route_refuses(
    amount: str, currency: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        charge(amount, currency)


def test_currency_field_is_required_and_the_body_format_is_the_routes() -> None:
    with pytest.raises(CurrencyMismatch, match="is missing"):
        price_request(POLICY, "pay", "POST", "/charges", {}, {"amount": "1"}, BodyFormat.FORM)
    with pytest.raises(UnsupportedBodyFormat, match="application/x-www-form-urlencoded"):
        charge("100", fmt=BodyFormat.JSON)
    with pytest.raises(UnsupportedBodyFormat):
        price_request(POLICY, "pay", "POST", "/payouts", {}, {"amount": 1}, BodyFormat.FORM)


QueryCase = tuple[dict[str, list[str]], Any, type[Exception], str]
QUERY_CASES: list[QueryCase] = [
    ({"amount": ["1"], "_method": ["DELETE"]}, None, UndeclaredQueryParameter, "_method"),
    ({"amount": ["1"], "Amount": ["7000"]}, None, UndeclaredQueryParameter, "Amount"),
    ({"amount": ["1", "7000"]}, None, BadQuery, "2 times"),
    ({"amount": ["1"]}, {"amount": 7000}, AmbiguousField, "more than one"),
    ({"amount": ["1"]}, {"AMOUNT": 7000}, AmbiguousField, "more than one"),
]


@pytest.mark.parametrize(("query", "body", "error", "message"), QUERY_CASES)
def test_effect_query_is_declared_single_and_unambiguous(
    query: dict[str, list[str]], body: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        price_request(POLICY, "pay", "POST", "/transfers", query, body, BodyFormat.JSON)


def test_reads_take_any_query_and_unknown_effects_none() -> None:
    read = price_request(POLICY, "pay", "GET", "/orders/o1", {"expand": ["a", "b"]}, None)
    assert read.effect_class is EffectClass.READ
    with pytest.raises(UndeclaredQueryParameter):
        price_request(POLICY, "pay", "POST", "/payouts", {"x": ["1"]}, {"amount": 1})


def test_a_path_parameter_repeated_in_the_body_is_ambiguous() -> None:
    body = {"fee": 1, "order_id": "o2"}
    with pytest.raises(AmbiguousField, match="order_id"):
        price_request(POLICY, "pay", "POST", "/orders/o1/fee", {}, body)
    fine = price_request(POLICY, "pay", "POST", "/orders/o1/fee", {}, {"fee": 1})
    assert fine.risk_factors == ("order:o1",)


@pytest.mark.parametrize("path", ["/orders/o;1/fee", "/orders/..;/fee", "/a/..;/transfers"])
def test_semicolons_and_dot_segments_in_effect_paths(path: str) -> None:
    with pytest.raises(RequestError) as info:
        price_request(POLICY, "pay", "POST", path, {}, {"fee": 1})
    assert info.value.reason == "bad_request"


@pytest.mark.parametrize(
    "path",
    [
        "/payouts/acct_42/\u202epots",  # shown to an approver as /payouts/acct_42/stop
        "/payouts/\u200bacct_42",
        "/x\r\x1b[2K1796150000000-0  approve",  # overwrites a terminal's journal line
        "/x\x00y",
        "/x\u2028y",
    ],
)
def test_paths_with_characters_a_reader_does_not_see_are_refused(path: str) -> None:
    """An unknown route's id is its path: approvers see it in the console and operators
    in `irrev ledger journal`."""
    with pytest.raises(RequestError, match="control or invisible") as info:
        price_request(POLICY, "pay", "POST", path, {}, {"amount": 1})
    assert info.value.reason == "bad_request"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/Transfers"),
        ("POST", "/transfers.json"),
        ("POST", "/transfers.x-y"),
        ("POST", "/transfers.json.x"),
        ("POST", "/transfers;v=2"),
        ("POST", "/ORDERS/o1/Fee"),
        ("DELETE", "/Orders/o1"),
    ],
)
def test_aliases_of_listed_routes_are_refused(method: str, path: str) -> None:
    with pytest.raises(RouteAlias):
        price_request(POLICY, "pay", method, path, {}, {"amount": 1})


def test_a_parameter_route_does_not_hide_a_literal_route_a_lenient_router_reads() -> None:
    """`GET /reports/export.json` matches the listed read `GET /reports/{name}`, but
    Rails, Spring and IIS route it to the listed effect `GET /reports/export`: it was
    priced as a free read (and `/payments/REFUND_ALL` as a 1 USD payment) while the
    upstream ran the literal route."""
    routes = [
        {"tool": "pay", "route": "GET /reports/{name}", "class": "read"},
        {
            "tool": "pay",
            "route": "GET /reports/export",
            "class": "irreversible",
            "query": ["amount"],
            "face_value": "amount",
        },
        {
            "tool": "pay",
            "route": "POST /payments/{payment_id}",
            "class": "reversible",
            "query": ["amount"],
            "face_value": "amount",
        },
        {
            "tool": "pay",
            "route": "POST /payments/refund_all",
            "class": "irreversible",
            "query": ["amount"],
            "face_value": "amount",
        },
    ]
    policy = load_policy_data({**DOCUMENT, "routes": routes}, "t1.yaml")
    for method, path in (
        ("GET", "/reports/export.json"),
        ("GET", "/reports/EXPORT"),
        ("GET", "/reports/export;v=1"),
        ("POST", "/payments/refund_all.json"),
        ("POST", "/payments/REFUND_ALL"),
    ):
        with pytest.raises(RouteAlias, match="lenient routers read it as"):
            price_request(policy, "pay", method, path, {"amount": "1"}, None)
    # What the parameter route alone reads stays its own, and so does the literal.
    read = price_request(policy, "pay", "GET", "/reports/Quarterly.pdf", {}, None)
    assert read.effect_class is EffectClass.READ
    exact = price_request(policy, "pay", "POST", "/payments/refund_all", {"amount": "7"}, None)
    assert exact.effect_class is EffectClass.IRREVERSIBLE
    one = price_request(policy, "pay", "POST", "/payments/p_1.json", {"amount": "7"}, None)
    assert one.effect_class is EffectClass.REVERSIBLE


def test_a_dotted_field_sent_also_as_a_flat_key_is_ambiguous() -> None:
    """A route declaring `payment.amount` priced the nested value and forwarded a flat
    `"payment.amount"` key too, which a flat-first reader (lodash's get, MongoDB's
    $set) takes instead: 1 USD priced, 45,000 run."""
    routes = [
        {
            "tool": "pay",
            "route": "POST /payouts",
            "class": "irreversible",
            "body": ["payment.amount", "payment.customer"],
            "face_value": "payment.amount",
        }
    ]
    policy = load_policy_data({**DOCUMENT, "routes": routes}, "t1.yaml")
    nested = {"payment": {"amount": "1", "customer": "c1"}}
    assert price_request(policy, "pay", "POST", "/payouts", {}, nested).price_micros == 1_000_000
    for flat in ("payment.amount", "Payment.Amount"):
        with pytest.raises(AmbiguousField, match="key with dots"):
            price_request(policy, "pay", "POST", "/payouts", {}, {**nested, flat: "45000"})


def test_unknown_routes_that_are_no_alias_are_priced_from_the_body() -> None:
    # The exact path of a listed read, under another method, is an unknown route.
    for method, path in (("POST", "/payouts"), ("DELETE", "/orders/o1")):
        effect = price_request(POLICY, "pay", method, path, {}, {"amount": 2})
        assert (effect.route, effect.price_micros) == (None, 2_000_000)


def test_a_tool_with_credentials_forwards_only_its_listed_routes() -> None:
    """Unknown routes are priced by the agent's own field: with the gateway's
    credentials added, `{"amount": 0}` would open DELETEs and exports for free."""
    tools = {"pay": {**DOCUMENT["tools"]["pay"], "credentials": {"Authorization": {"env": "K"}}}}
    policy = load_policy_data({**DOCUMENT, "tools": tools}, "t1.yaml")
    for method, path in (("DELETE", "/refunds/r1"), ("GET", "/admin/export")):
        with pytest.raises(UnknownRoute, match="credentials"):
            price_request(policy, "pay", method, path, {}, {"amount": 0})
    listed = price_request(policy, "pay", "POST", "/transfers", {"amount": ["2"]}, None)
    assert listed.price_micros == 2_000_000


@pytest.mark.parametrize(
    "value",
    [Decimal("1e999999"), Decimal("1e-999999"), 10**50, Decimal("1e-41"), "1" * 60],
)
def test_amounts_out_of_range_are_amount_errors(value: object) -> None:
    with pytest.raises(AmountError, match="out of range"):
        to_decimal(value)


def test_products_round_up_even_past_the_context_precision() -> None:
    long = Decimal("1." + "0" * 200 + "1")
    assert product_to_minor([long], 10**6) == 1_000_001
    assert product_to_minor([Decimal(1)], 10**6, 100) == 10_000
    with pytest.raises(AmountError, match="maximum"):
        product_to_minor([Decimal("1e40"), Decimal("1e40")], 10**6)


def test_operator_amounts_with_more_digits_than_exact_are_refused() -> None:
    with pytest.raises(AmountError, match="more than 120 digits"):
        major_to_minor("1." + "0" * 200 + "1", 10**6)
