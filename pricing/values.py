"""The values a policy document is written in: ids and names, amounts in major units
held as exact minor units, durations, scales and upstream URLs. Each is an annotated
type that validates (and converts) what the YAML says; pricing/policy.py builds the
document from them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
)

from pricing.errors import AmountError
from pricing.money import major_to_minor, to_decimal

SCALE_CONTEXT = "risk_unit_scale"
UNKNOWN_SCALE = -1

TenantId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
# No ':' so that `principal:<id>` and `agent:<id>` parse back unambiguously.
MemberId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._@/-]{1,100}$")]
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
FieldName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
]
FactorPattern = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9._@/-]+:([A-Za-z0-9._:@/-]*\*|[A-Za-z0-9._:@/-]+)$")
]
TokenHash = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
SoftBand = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False, strict=True)]


def _to_micros(value: object, info: ValidationInfo) -> int:
    scale = (info.context or {}).get(SCALE_CONTEXT)
    if scale is None:
        raise ValueError(
            "amounts need the risk unit's scale; build policies with load_policy_text/data"
        )
    try:
        if scale == UNKNOWN_SCALE:
            # risk_unit itself is reported; still catch amounts that are wrong at any scale.
            to_decimal(value)
            return 0
        return major_to_minor(value, scale)
    except AmountError as exc:
        raise ValueError(f"amount {exc}") from None


# What an editor sees (`irrev policy schema`): the written form, not the int it becomes.
_AMOUNT_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
        {"type": "number", "minimum": 0},
    ],
    "description": "an amount in major units of the risk unit, e.g. '250000' or 14.80",
}
Micros = Annotated[int, BeforeValidator(_to_micros), WithJsonSchema(_AMOUNT_SCHEMA)]
"""An operator-written major-unit amount, held as exact minor units."""

_DURATION = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _to_ms(value: object) -> int:
    if not isinstance(value, str) or not (m := _DURATION.match(value.strip())):
        raise ValueError(
            f"duration {value!r} must be a whole number with a unit: ms, s, m, h or d "
            "(e.g. '24h', '15m')"
        )
    ms = int(m.group(1)) * _UNIT_MS[m.group(2)]
    if not 0 < ms <= 366 * 86_400_000:
        raise ValueError(f"duration {value!r} must be above 0 and at most 366d")
    return ms


def duration_ms(value: str) -> int:
    """A duration as policies write it ('15m', '2h'), in ms; ValueError if it is not one."""
    return _to_ms(value)


DurationMs = Annotated[
    int,
    BeforeValidator(_to_ms),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^[0-9]+(ms|s|m|h|d)$",
            "description": "a whole number with a unit: ms, s, m, h or d (e.g. '24h')",
        }
    ),
]


def _to_ms_or_zero(value: object) -> int:
    """A duration that may also be 0 ('0', '0s'): the feature it sets is off."""
    zero = value == 0 and not isinstance(value, bool)
    if zero or (isinstance(value, str) and re.fullmatch(r"0+(ms|s|m|h|d)?", value.strip())):
        return 0
    return _to_ms(value)


DurationOrZeroMs = Annotated[
    int,
    BeforeValidator(_to_ms_or_zero),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^(0|[0-9]+(ms|s|m|h|d))$",
            "description": "a whole number with a unit (e.g. '10m'), or 0 for none",
        }
    ),
]


def _upstream_url(value: str) -> str:
    if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", value):
        raise ValueError(
            f"upstream {value!r} must be an http(s) base URL such as 'http://127.0.0.1:8900'"
        )
    return value.rstrip("/")


UpstreamUrl = Annotated[str, AfterValidator(_upstream_url)]


VALID_SCALES = frozenset(10**k for k in range(10))


def _power_of_ten(value: int) -> int:
    if value not in VALID_SCALES:
        raise ValueError(f"scale {value} must be a power of ten from 1 to 10**9, e.g. 1000000")
    return value


Scale = Annotated[int, Field(strict=True), AfterValidator(_power_of_ten)]
