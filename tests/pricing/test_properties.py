"""Property tests: prices are monotone, non-negative, bounded by face, and subadditive."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pricing import (
    BetaShape,
    ExpectedPricing,
    FacePricing,
    QuantilePricing,
    StressedPricing,
    TenantPolicy,
    load_policy_text,
    price_request,
    round_up,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACME = load_policy_text((EXAMPLES / "procurement.yaml").read_text(), "procurement.yaml")

faces = st.integers(min_value=0, max_value=2**40)
shape = st.floats(min_value=0.05, max_value=200)
unit = st.floats(min_value=0.0, max_value=1.0)
open_unit = st.floats(min_value=0.001, max_value=0.999)
specs = st.one_of(
    st.builds(FacePricing),
    st.builds(
        lambda a, b, p: ExpectedPricing(
            model="expected", recovery=BetaShape(alpha=a, beta=b), p_fail=p
        ),
        shape,
        shape,
        unit,
    ),
    st.builds(
        lambda a, b, p, lv: QuantilePricing(
            model="quantile", recovery=BetaShape(alpha=a, beta=b), p_fail=p, level=lv
        ),
        shape,
        shape,
        unit,
        open_unit,
    ),
    st.builds(
        lambda a, b, p, rho, q, lv: StressedPricing(
            model="stressed",
            recovery=BetaShape(alpha=a, beta=b),
            p_fail=p,
            rho=rho,
            stress_quantile=q,
            level=lv,
        ),
        shape,
        shape,
        unit,
        st.floats(min_value=0.0, max_value=0.95),
        open_unit,
        open_unit,
    ),
)


@given(specs, faces, faces)
def test_price_is_non_decreasing_in_face_value(spec: FacePricing, a: int, b: int) -> None:
    low, high = sorted((a, b))
    f = spec.loss_factor()
    assert round_up(low, f) <= round_up(high, f)


@given(specs, faces)
def test_price_is_never_negative_nor_above_face(spec: FacePricing, face: int) -> None:
    price = round_up(face, spec.loss_factor())
    assert 0 <= price <= face


@given(st.floats(min_value=0.0, max_value=2.0), faces)
def test_only_a_configured_surcharge_prices_above_face(surcharge: float, face: int) -> None:
    price = round_up(face, FacePricing(surcharge=surcharge).loss_factor())
    assert face <= price <= round_up(face, 1.0 + surcharge)


@given(specs, st.lists(st.integers(min_value=0, max_value=2**32), min_size=1, max_size=50))
def test_splitting_never_costs_less_than_the_whole(spec: FacePricing, pieces: list[int]) -> None:
    f = spec.loss_factor()
    assert sum(round_up(p, f) for p in pieces) >= round_up(sum(pieces), f)


def _order(policy: TenantPolicy, quantity: int, unit_price: str) -> int:
    body = {"supplier_id": "s1", "sku": "x", "quantity": quantity, "unit_price": unit_price}
    return price_request(policy, "supplier", "POST", "/orders", {}, body).price_micros


prices = st.decimals(min_value=0, max_value=10**5, places=2).map(str)


@given(st.integers(min_value=0, max_value=1000), st.integers(min_value=0, max_value=1000), prices)
def test_catalog_price_monotone_in_quantity(q1: int, q2: int, unit_price: str) -> None:
    low, high = sorted((q1, q2))
    assert _order(ACME, low, unit_price) <= _order(ACME, high, unit_price)


@given(st.lists(st.integers(min_value=1, max_value=500), min_size=2, max_size=20), prices)
def test_split_orders_cost_at_least_one_order(quantities: list[int], unit_price: str) -> None:
    split = sum(_order(ACME, q, unit_price) for q in quantities)
    assert split >= _order(ACME, sum(quantities), unit_price)


@given(st.text(alphabet="abc123-", min_size=1, max_size=20), st.dictionaries(st.text(), st.text()))
def test_read_routes_cost_zero(order_id: str, query: dict[str, str]) -> None:
    effect = price_request(ACME, "supplier", "GET", f"/orders/{order_id}", query, None)
    assert effect.price_micros == 0
    assert effect.effect_class.value == "read"
