"""Exact major-unit conversions, the bounds of an amount, and request face values."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pricing import MAX_MICROS, AmountError, major_to_minor, minor_to_major_text
from pricing.money import product_to_minor, to_decimal
from pricing.values import _to_ms

USD = 10**6


@pytest.mark.parametrize(
    ("value", "micros"),
    [
        pytest.param("250000", 250_000 * USD, id="decimal-string"),
        pytest.param(14.80, 14_800_000, id="yaml-float-by-its-repr"),
        pytest.param(0.1, 100_000, id="float-0.1-exact"),
        pytest.param(Decimal("0.000001"), 1, id="one-micro"),
        pytest.param(0, 0, id="zero"),
        pytest.param(9_007_199_254, 9_007_199_254 * USD, id="large-but-in-range"),
    ],
)
def test_major_to_minor(value: object, micros: int) -> None:
    assert major_to_minor(value, USD) == micros


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("0.0000001", "not exact", id="below-one-micro"),
        pytest.param(-1, "negative", id="negative"),
        pytest.param(True, "boolean", id="bool"),
        pytest.param(float("nan"), "finite", id="nan"),
        pytest.param(float("inf"), "finite", id="inf"),
        pytest.param(Decimal("NaN"), "finite", id="decimal-nan"),
        pytest.param("1e3", "plain", id="exponent-string"),
        pytest.param(" 5", "plain", id="whitespace"),
        pytest.param("-5", "plain", id="negative-string"),
        pytest.param(None, "NoneType", id="null"),
        # Python's \d and Decimal() take any Unicode digit; an upstream reads ASCII.
        pytest.param("\u0661\u0662", "plain", id="arabic-indic-digits"),
        pytest.param("1.\u0665", "plain", id="arabic-indic-fraction"),
        pytest.param("\uff11\uff10", "plain", id="fullwidth-digits"),
        pytest.param(9_007_199_255, "maximum", id="above-2-53"),
    ],
)
def test_major_to_minor_rejects(value: object, message: str) -> None:
    with pytest.raises(AmountError, match=message):
        major_to_minor(value, USD)


def test_product_rounds_up_once() -> None:
    assert product_to_minor([Decimal(3), Decimal("14.805")], USD) == 44_415_000
    assert product_to_minor([Decimal("0.0000001")], USD) == 1  # sub-micro rounds up
    with pytest.raises(AmountError, match="maximum"):
        product_to_minor([Decimal(MAX_MICROS), Decimal(2)], 1)


def test_to_decimal_accepts_request_numbers() -> None:
    assert to_decimal(3) == 3
    assert to_decimal(Decimal("1.25")) == Decimal("1.25")
    assert to_decimal("1.25") == Decimal("1.25")


def test_display_form() -> None:
    assert minor_to_major_text(12_500_000, USD) == "12.5"
    assert minor_to_major_text(250_000 * USD, USD) == "250000"
    assert minor_to_major_text(1, 100) == "0.01"


@pytest.mark.parametrize("written", ["\u0662h", "1\u0660m", "\uff15s"])
def test_a_policy_duration_takes_ascii_digits_only(written: str) -> None:
    with pytest.raises(ValueError, match="whole number with a unit"):
        _to_ms(written)
