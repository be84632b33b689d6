"""Integer money: conversions from decimal major units and the one rounding rule.

Amounts are `int` minor units (e.g. micro-USD) everywhere outside pricing math. The
only float-to-int step is `round_up`: a price is rounded towards the budget's
safety, never towards the agent.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal, DecimalException, Inexact, localcontext
from fractions import Fraction
from functools import lru_cache

from ledger.limits import MAX_AMOUNT
from pricing.errors import AmountError

MAX_MICROS = MAX_AMOUNT
"""Largest amount the ledger accepts: exact in a Lua double and in JSON numbers."""

_PLAIN_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")  # ASCII: \d takes any Unicode digit
# Enough digits that a product of a few request fields is exact before scaling.
_PRECISION = 120
# Amounts are read only within 10**+-40 (far beyond 2**53 minor units either way), so
# no product of request fields can leave a Decimal context's exponent range: 1e999999
# is refused as an amount, never an overflow (a 500).
MAX_EXPONENT = 40


def to_decimal(value: object) -> Decimal:
    """An exact Decimal from an int, Decimal, finite float or plain decimal string.

    Floats are read through their shortest repr, which is what a person wrote in YAML
    (`14.80` -> `14.8`). Exponent forms, signs and whitespace in strings are refused
    so that the gateway prices exactly the digits the upstream will read.
    """
    if isinstance(value, bool):
        raise AmountError("is a boolean, not a number")
    if isinstance(value, int):
        result = Decimal(value)
    elif isinstance(value, Decimal):
        result = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise AmountError(f"is {value!r}; amounts must be finite")
        result = Decimal(repr(value))
    elif isinstance(value, str):
        if not _PLAIN_DECIMAL.fullmatch(value):
            raise AmountError(
                f"{value!r} is not a plain non-negative decimal number (digits and one '.')"
            )
        result = Decimal(value)
    else:
        raise AmountError(f"is a {type(value).__name__}, not a number")
    if not result.is_finite():
        raise AmountError(f"is {result}; amounts must be finite")
    if result < 0:
        raise AmountError(f"is negative ({result}); amounts are never negative")
    if result and not -MAX_EXPONENT <= result.adjusted() <= MAX_EXPONENT:
        raise AmountError(
            f"is out of range (10**{result.adjusted()}); amounts are read between "
            f"10**-{MAX_EXPONENT} and 10**{MAX_EXPONENT}"
        )
    return result


def major_to_minor(value: object, scale: int) -> int:
    """Exact conversion of a major-unit amount (`"250000"`, `14.80`) to minor units.

    Used for operator-written limits: an amount with more decimals than the unit has
    is an error rather than silently rounded, because a limit must mean what it says.
    """
    amount = to_decimal(value)
    try:
        with localcontext() as ctx:
            ctx.prec = _PRECISION
            ctx.traps[Inexact] = True
            minor = amount * scale
    except DecimalException as exc:
        raise AmountError(f"{amount:f} has more than {_PRECISION} digits") from exc
    if minor != minor.to_integral_value():
        digits = len(str(scale)) - 1
        raise AmountError(
            f"{amount:f} is not exact in minor units (scale {scale}); "
            f"use at most {digits} decimal places"
        )
    result = int(minor)
    check_minor(result)
    return result


def product_to_minor(factors: list[Decimal], scale: int, per_unit: int = 1) -> int:
    """Minor units of a product of factors, rounded up (a face value): `scale` minor
    units per major unit, the factors' product counted in 1/`per_unit` major units
    (1: major units; 100: cents, as a route's `amount_scale` says)."""
    try:
        with localcontext() as ctx:
            # Every factor is non-negative: rounding each step up keeps the result an
            # upper bound of the exact product, so a price never rounds towards the agent.
            ctx.prec, ctx.rounding = _PRECISION, ROUND_CEILING
            total = Decimal(scale)
            for factor in factors:
                total *= factor
            total /= per_unit
            result = int(total.to_integral_value())
    except DecimalException as exc:
        raise AmountError(f"cannot be computed ({type(exc).__name__})") from exc
    check_minor(result)
    return result


def check_minor(amount: int) -> int:
    """`amount` if it is an int the ledger can hold, else AmountError."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise AmountError(f"{amount!r} is not an integer amount")
    if amount < 0:
        raise AmountError(f"{amount} is negative")
    if amount > MAX_MICROS:
        raise AmountError(f"{amount} is above the ledger's maximum {MAX_MICROS} (2**53 - 1)")
    return amount


def round_up(face_value_micros: int, factor: float) -> int:
    """The one rounding rule: ceil(face value x factor), computed exactly.

    The factor is read as the shortest decimal that its float prints as (0.1 is 1/10,
    not the binary fraction just above it), the product is exact, and only the final
    ceiling rounds. Exactness is what makes prices subadditive:
    ceil(a f) + ceil(b f) >= ceil((a + b) f), so splitting an effect never costs less.
    """
    numerator, denominator = _exact_ratio(factor)
    return -((-face_value_micros * numerator) // denominator)


@lru_cache(maxsize=4096)
def _exact_ratio(factor: float) -> tuple[int, int]:
    if not math.isfinite(factor) or factor < 0:
        raise AmountError(f"pricing factor {factor!r} must be finite and non-negative")
    ratio = Fraction(repr(factor))
    return ratio.numerator, ratio.denominator


def minor_to_major_text(amount: int, scale: int) -> str:
    """`12500000`, scale 10**6 -> `12.5`: a display form for people, never parsed back."""
    text = format(Decimal(amount) / Decimal(scale), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def money_text(amount: int, scale: int, currency: str) -> str:
    """`1234500000`, scale 10**6, USD -> `1,234.5 USD`: for people, never parsed back.
    A negative amount (a shadow-mode overdraft's room left) keeps its sign."""
    sign = "-" if amount < 0 else ""
    whole, dot, fraction = minor_to_major_text(abs(amount), scale).partition(".")
    return f"{sign}{int(whole):,}{dot}{fraction} {currency}"
