"""Table tests of every pricing model, including the published reference values."""

from __future__ import annotations

import math

import pytest

from pricing import (
    BetaShape,
    ExpectedPricing,
    FacePricing,
    FailureBound,
    FailurePosterior,
    QuantilePricing,
    RecoveryPosterior,
    StressedPricing,
    expected_lgd,
    quantile_lgd,
    round_up,
    stressed_lgd,
    vasicek_pd,
)
from pricing.models import apply_learning

B62 = BetaShape(alpha=6, beta=2)


@pytest.mark.parametrize(
    ("alpha", "beta", "level", "expected"),
    [
        pytest.param(6, 2, 0.95, 0.521, id="published-charge-beta62-q095"),
        pytest.param(2, 6, 0.95, 0.947, id="correlated-burst-beta26-q095"),
        pytest.param(6, 2, 0.999, 0.763, id="unsettled-hold-beta62-q0999"),
        pytest.param(1, 1, 0.95, 0.950, id="uniform-recovery"),
    ],
)
def test_quantile_reference_values(
    alpha: float, beta: float, level: float, expected: float
) -> None:
    assert round(quantile_lgd(alpha, beta, 0.0, level), 3) == expected


def test_vasicek_reference_value() -> None:
    # PD 2%, asset correlation 0.12, 99% factor stress -> about 4.6x the unconditional PD.
    stressed = vasicek_pd(0.02, 0.12, 0.99)
    assert stressed == pytest.approx(0.0917, abs=1e-4)
    assert round(stressed / 0.02, 1) == 4.6


@pytest.mark.parametrize(
    ("p", "rho", "q", "expected"),
    [
        pytest.param(0.02, 0.0, 0.99, 0.02, id="no-correlation-no-stress"),
        pytest.param(0.0, 0.5, 0.99, 0.0, id="zero-pd-stays-zero"),
        pytest.param(1.0, 0.5, 0.99, 1.0, id="certain-failure-stays-certain"),
        pytest.param(0.02, 0.12, 0.5, 0.0143, id="median-factor-below-pd"),
    ],
)
def test_vasicek_edges(p: float, rho: float, q: float, expected: float) -> None:
    assert vasicek_pd(p, rho, q) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("spec", "factor"),
    [
        pytest.param(FacePricing(), 1.0, id="face"),
        pytest.param(FacePricing(surcharge=0.1), 1.1, id="face-with-surcharge"),
        pytest.param(ExpectedPricing(model="expected", recovery=B62), 0.25, id="expected-mean-r"),
        pytest.param(
            ExpectedPricing(model="expected", recovery=B62, p_fail=0.1),
            0.25 + 0.75 * 0.1,
            id="expected-with-p-fail",
        ),
        pytest.param(
            QuantilePricing(model="quantile", recovery=B62, level=0.95), 0.5207, id="quantile"
        ),
        pytest.param(
            QuantilePricing(model="quantile", recovery=B62, level=0.95, p_fail=1.0),
            1.0,
            id="quantile-compensation-always-fails",
        ),
        pytest.param(
            StressedPricing(model="stressed", recovery=B62, rho=0.0, level=0.95),
            0.5207,
            id="stressed-rho0-is-quantile",
        ),
        pytest.param(
            StressedPricing(model="stressed", recovery=B62, rho=0.12, p_fail=0.02, level=0.5),
            # r_q = F^-1(Phi(-sqrt(0.12) Phi^-1(0.99))) = 0.6356 for Beta(6, 2)
            1 - 0.6356 * (1 - 0.0917),
            id="stressed-median-recovery-under-stress",
        ),
    ],
)
def test_loss_factor_table(
    spec: FacePricing | ExpectedPricing | QuantilePricing | StressedPricing, factor: float
) -> None:
    assert spec.loss_factor() == pytest.approx(factor, abs=2e-4)


def test_stressed_recovery_worsens_with_correlation() -> None:
    calm = quantile_lgd(6, 2, 0.02, 0.95)
    mild = stressed_lgd(6, 2, 0.02, 0.05, 0.99, 0.95)
    severe = stressed_lgd(6, 2, 0.02, 0.3, 0.99, 0.95)
    assert calm < mild < severe <= 1.0


def test_model_order_is_conservative() -> None:
    # Mean < high quantile < stressed high quantile < face: each step is more cautious.
    assert expected_lgd(6, 2, 0.0) < quantile_lgd(6, 2, 0.0, 0.999)
    assert quantile_lgd(6, 2, 0.0, 0.999) < stressed_lgd(6, 2, 0.0, 0.12, 0.99, 0.999) < 1.0


@pytest.mark.parametrize(
    ("face", "factor", "price"),
    [
        pytest.param(1_000_000, 0.5207029735913071, 520_703, id="rounds-up"),
        pytest.param(10, 0.1, 1, id="factor-read-as-its-shortest-decimal"),
        pytest.param(0, 0.7, 0, id="zero-face"),
        pytest.param(2**53 - 1, 1.0, 2**53 - 1, id="max-face-at-face"),
        pytest.param(7, 0.0, 0, id="free"),
    ],
)
def test_round_up(face: int, factor: float, price: int) -> None:
    assert round_up(face, factor) == price


def test_round_up_never_below_exact_product() -> None:
    assert round_up(3, 1 / 3) >= 1
    assert round_up(100, 0.29) == 29  # 0.29 is just below 29/100 in binary: ceil, not 30


def test_failure_posterior_upper_bound() -> None:
    prior = FailurePosterior(1, 1)
    learned = prior.observe(compensated=98, failed=2)
    assert (learned.alpha, learned.beta) == (3, 99)
    bound = learned.upper_bound(0.95)
    assert 2 / 100 < bound < 0.07  # above the point estimate, not wildly so
    assert learned.observe(compensated=900, failed=20).upper_bound(0.95) < bound


def test_recovery_posterior_lower_bound() -> None:
    learned = RecoveryPosterior(1, 1).observe([0.7, 0.8, 0.75, 0.72, 0.78] * 20)
    assert learned.lower_bound(0.95) < 0.75 < learned.alpha / (learned.alpha + learned.beta) + 0.01
    a, b = learned.recovery_shape(0.95, 8.0)
    assert a + b == pytest.approx(8.0)
    assert a / (a + b) == pytest.approx(learned.lower_bound(0.95))


def test_learning_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="never negative"):
        FailurePosterior().observe(compensated=-1, failed=0)
    with pytest.raises(ValueError, match="within"):
        RecoveryPosterior().observe([1.5])
    with pytest.raises(ValueError, match="positive"):
        FailurePosterior(0, 1)
    with pytest.raises(ValueError, match="strictly between"):
        FailurePosterior().upper_bound(1.0)


def test_apply_learning_replaces_parameters_conservatively() -> None:
    spec = QuantilePricing(model="quantile", recovery=B62, level=0.95)
    failures = FailurePosterior(1, 1).observe(compensated=40, failed=4)
    learned = apply_learning(spec, failures=failures, level=0.95)
    assert learned.p_fail == pytest.approx(failures.upper_bound(0.95))
    assert learned.loss_factor() > spec.loss_factor()
    worse = RecoveryPosterior(1, 1).observe([0.5] * 50)
    relearned = apply_learning(spec, recovery=worse, level=0.95)
    assert isinstance(relearned.recovery, BetaShape)
    assert relearned.loss_factor() > spec.loss_factor()


def test_failure_bound_in_policy_is_the_upper_credible_bound() -> None:
    bound = FailureBound(alpha=1, beta=99, level=0.95)
    assert bound.value() == pytest.approx(FailurePosterior(1, 99).upper_bound(0.95))
    assert bound.value() > 0.01  # the posterior mean: pricing uses the bound, not the mean
    spec = ExpectedPricing(model="expected", recovery=B62, p_fail=bound)
    assert spec.loss_factor() == pytest.approx(0.25 + 0.75 * bound.value())
    assert math.isfinite(spec.loss_factor())
