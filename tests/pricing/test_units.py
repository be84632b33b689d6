"""How amounts and times are shown to people, and which routes run in shadow mode."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from pricing import load_policy_data, price_request
from pricing.errors import PolicyError
from pricing.money import money_text
from pricing.serving import is_shadow
from pricing.units import header_money, rfc3339, with_money_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ORDER = {"supplier_id": "s", "sku": "k", "quantity": 1, "unit_price": Decimal("10")}


@pytest.mark.parametrize(
    ("amount", "text", "header"),
    [
        (0, "0 USD", "0 USD"),
        (1_234_560_000, "1,234.56 USD", "1234.56 USD"),
        (1, "0.000001 USD", "0.000001 USD"),
        (-31_500_000, "-31.5 USD", "-31.5 USD"),
        (-1_234_000_000, "-1,234 USD", "-1234 USD"),
    ],
    ids=["zero", "thousands", "one-minor-unit", "negative", "negative-thousands"],
)
def test_money_for_people_and_for_headers(amount: int, text: str, header: str) -> None:
    assert money_text(amount, 10**6, "USD") == text
    assert header_money(amount, 10**6, "USD") == header


def test_json_keeps_the_integers_beside_their_text() -> None:
    shown = with_money_text(
        {"price": 2_500_000, "amounts": {"tenant:a": 10**6}, "threshold": None}, 10**6, "USD"
    )
    assert shown == {
        "price": 2_500_000,
        "price_text": "2.5 USD",
        "amounts": {"tenant:a": 10**6},
        "amounts_text": {"tenant:a": "1 USD"},
        "currency": "USD",
    }


@pytest.mark.parametrize(
    ("epoch_ms", "text"),
    [(0, "1970-01-01T00:00:00.000Z"), (1_764_529_200_123, "2025-11-30T19:00:00.123Z")],
)
def test_rfc3339(epoch_ms: int, text: str) -> None:
    assert rfc3339(epoch_ms) == text


def _procurement(**changes: object) -> dict[str, object]:
    data: dict[str, object] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())
    data.update(changes)
    return data


def test_a_routes_mode_overrides_the_tenants() -> None:
    enforced = load_policy_data(_procurement(), "p")
    assert not is_shadow(
        enforced, price_request(enforced, "supplier", "POST", "/orders", {}, ORDER)
    )
    data = _procurement(mode="shadow")
    routes = data["routes"]
    assert isinstance(routes, list)
    for route in routes:
        if route["route"] == "POST /orders":
            route["mode"] = "enforce"
    policy = load_policy_data(data, "p")
    orders = price_request(policy, "supplier", "POST", "/orders", {}, ORDER)
    refund = {"customer_id": "c", "amount": Decimal("5")}
    refunds = price_request(policy, "payments", "POST", "/refunds", {}, refund)
    assert (is_shadow(policy, orders), is_shadow(policy, refunds)) == (False, True)


def test_an_unknown_mode_is_refused_by_field() -> None:
    with pytest.raises(PolicyError) as raised:
        load_policy_data(_procurement(mode="observe"), "p")
    assert any(problem.path == "mode" for problem in raised.value.findings)
