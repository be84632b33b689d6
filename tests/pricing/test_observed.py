"""Prices learn from compensation outcomes: a route priced with a p_fail posterior
moves with what was observed on it, conservatively; a fixed p_fail does not move."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pricing import Outcomes, TenantPolicy, load_policy_text, with_observed
from pricing.observed import saturated

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "procurement.yaml"
POLICY = load_policy_text(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE))
CANCEL = "supplier POST /orders/{order_id}/cancel"  # p_fail: {alpha: 1, beta: 99, level: 0.95}
REFUND = "payments POST /refunds"  # p_fail: 0.02, the operator's fixed word


def factor(policy: TenantPolicy, route_id: str) -> float:
    routes = [r for group in policy.catalog.routes.values() for r in group]
    return next(r.loss_factor for r in routes if r.route_id == route_id)


def test_failures_raise_and_successes_lower_a_learnable_route() -> None:
    written = factor(POLICY, CANCEL)
    failed = with_observed(POLICY, {CANCEL: Outcomes(failures=5)})
    fine = with_observed(POLICY, {CANCEL: Outcomes(successes=500)})
    assert factor(failed, CANCEL) > written > factor(fine, CANCEL) > 0
    # p_fail = q_0.95 of Beta(1 + 5, 99) = 0.0984; E[r] = 0.95: 1 - 0.95 * (1 - 0.0984)
    assert factor(failed, CANCEL) == pytest.approx(0.1435, abs=5e-4)
    assert factor(POLICY, CANCEL) == written  # the written policy is left as it was


def test_fixed_p_fail_and_unknown_routes_do_not_move() -> None:
    learned = with_observed(POLICY, {REFUND: Outcomes(failures=50), "no such route": Outcomes(9)})
    for group in POLICY.catalog.routes.values():
        for route in group:
            assert factor(learned, route.route_id) == route.loss_factor


@given(st.integers(0, 200), st.integers(0, 200), st.integers(1, 50))
def test_more_failures_never_price_lower(failures: int, successes: int, more: int) -> None:
    base = with_observed(POLICY, {CANCEL: Outcomes(failures, successes)})
    worse = with_observed(POLICY, {CANCEL: Outcomes(failures + more, successes)})
    assert factor(worse, CANCEL) >= factor(base, CANCEL)


def test_counts_are_never_negative() -> None:
    with pytest.raises(ValueError, match="never negative"):
        Outcomes(failures=-1)


@given(st.integers(0, 10**18), st.integers(0, 10**18))
def test_counts_past_the_policy_bound_saturate_at_the_same_rate(
    failures: int, successes: int
) -> None:
    """However many outcomes were counted, the learned policy stays valid: a reload
    that applies them never fails."""
    learned = with_observed(POLICY, {CANCEL: Outcomes(failures, successes)})
    assert 0 < factor(learned, CANCEL) <= 1


def test_saturation_keeps_the_failure_rate() -> None:
    alpha, beta = saturated(3_000_000.0, 1_000_000.0)
    assert (alpha, beta) == (1e6, pytest.approx(1e6 / 3))
    assert saturated(5.0, 7.0) == (5.0, 7.0)
