"""Amounts and instants as people read them, beside the integers machines read.

JSON keeps every integer minor-unit field and gains a `<field>_text` sibling
("1,234.56 USD", `money_text`) and the object's `currency`; an epoch-millisecond
field `<name>_ms` gains `<name>_at`, an RFC 3339 UTC time. Headers carry the unit
with `header_money` ("1234.56 USD"): no thousands separator, since a comma splits a
header's value into a list (RFC 9110 section 5.3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from pricing.money import minor_to_major_text, money_text

Amount = int | Mapping[str, int]


def with_money_text(
    fields: Mapping[str, Amount | None], scale: int, currency: str
) -> dict[str, object]:
    """`fields` with a `<name>_text` after each amount (a per-account mapping gets a
    mapping of texts), and `currency`; None values are left out."""
    shown: dict[str, object] = {}
    for name, value in fields.items():
        if value is None:
            continue
        shown[name] = value
        if isinstance(value, int):
            shown[f"{name}_text"] = money_text(value, scale, currency)
        else:
            shown[f"{name}_text"] = {k: money_text(v, scale, currency) for k, v in value.items()}
    shown["currency"] = currency
    return shown


def journal_money(
    shown: Mapping[str, str], changes: Iterable[tuple[str, int, int]], scale: int, currency: str
) -> dict[str, object]:
    """A journal entry as stored (`shown`) with its amounts as people read them: its
    balance `changes` (account, pending, posted: signed minor units), each with its
    texts, the face value's text where it has one, and `currency`."""
    out: dict[str, object] = dict(shown)
    out["changes"] = [
        {
            "account": account,
            "pending": pending,
            "pending_text": money_text(pending, scale, currency),
            "posted": posted,
            "posted_text": money_text(posted, scale, currency),
        }
        for account, pending, posted in changes
    ]
    if shown.get("face_value", "").isdigit():
        out["face_value_text"] = money_text(int(shown["face_value"]), scale, currency)
    out["currency"] = currency
    return out


def header_money(amount: int, scale: int, currency: str) -> str:
    """`12340000`, 10**6, USD -> `12.34 USD`; a negative amount keeps its sign."""
    sign = "-" if amount < 0 else ""
    return f"{sign}{minor_to_major_text(abs(amount), scale)} {currency}"


def rfc3339(epoch_ms: int) -> str:
    """`1764529200000` -> `2025-11-30T19:00:00.000Z`."""
    # Whole seconds and milliseconds apart: exact, where epoch_ms / 1000 is a float.
    instant = datetime.fromtimestamp(epoch_ms // 1000, UTC) + timedelta(
        milliseconds=epoch_ms % 1000
    )
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
