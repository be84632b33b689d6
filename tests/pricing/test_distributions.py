"""pricing.distributions against scipy (the oracle here, never imported by pricing/) and
against closed forms where scipy itself strays (Beta(0.5, 2) at 1e-10, say)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import betainc, betaincc
from scipy.stats import beta as scipy_beta
from scipy.stats import norm

from pricing.distributions import beta_cdf, beta_ppf, normal_cdf, normal_ppf

TOLERANCE = 1e-12
SHAPES = [0.1, 0.5, 1.0, 2.0, 3.7, 6.0, 9.9, 10.0, 10.5, 37.0, 500.0, 1e4]
LEVELS = [1e-8, 1e-4, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 0.999, 1 - 1e-6, 1 - 1e-8]
POINTS = [1e-12, 1e-4, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.9999]


def close(got: float, want: float) -> bool:
    """Within 1e-12 of want, relative to it: absolute for values near 1, and tiny
    values keep their digits too."""
    return abs(got - want) <= TOLERANCE * abs(want)


@pytest.mark.parametrize("b", SHAPES)
@pytest.mark.parametrize("a", SHAPES)
def test_beta_ppf_matches_scipy_on_a_grid(a: float, b: float) -> None:
    for level in LEVELS:
        want = float(scipy_beta.ppf(level, a, b))
        assert close(beta_ppf(level, a, b), want), (level, want)


@pytest.mark.parametrize("b", SHAPES)
@pytest.mark.parametrize("a", SHAPES)
def test_beta_cdf_matches_scipy_on_a_grid(a: float, b: float) -> None:
    for x in POINTS:
        want = float(betainc(a, b, x))
        if want > 1e-300:
            assert close(beta_cdf(x, a, b), want), (x, want)


@settings(max_examples=300, deadline=None)
@given(
    a=st.floats(min_value=0.1, max_value=1e4),
    b=st.floats(min_value=0.1, max_value=1e4),
    level=st.floats(min_value=1e-8, max_value=1 - 1e-8),
)
def test_beta_ppf_matches_scipy(a: float, b: float, level: float) -> None:
    got, want = beta_ppf(level, a, b), float(scipy_beta.ppf(level, a, b))
    # scipy's quantile strays past 1e-12 in places (the median of Beta(1.75, 1.75) is
    # 0.5 + 1e-12 to it): there, scipy's own CDF must find ours at least as close.
    assert close(got, want) or miss(got, a, b, level) <= miss(want, a, b, level)


def miss(x: float, a: float, b: float, level: float) -> float:
    """How far I_x(a, b) is from level, relative to the tail's size, by scipy."""
    if level <= 0.5:
        return abs(float(betainc(a, b, x)) - level) / level
    return abs(float(betaincc(a, b, x)) - (1 - level)) / (1 - level)


@pytest.mark.parametrize("shape", [0.1, 0.5, 2.0, 37.0, 1e3, 1e6])
@pytest.mark.parametrize("level", [1e-300, 1e-100, 1e-10, 0.05, 0.95, 1 - 1e-10])
def test_beta_ppf_closed_forms(shape: float, level: float) -> None:
    # I_x(a, 1) = x^a and I_x(1, b) = 1 - (1 - x)^b: huge shapes and tiny tails.
    assert close(beta_ppf(level, shape, 1.0), level ** (1.0 / shape))
    assert close(beta_ppf(level, 1.0, shape), -math.expm1(math.log1p(-level) / shape))


@pytest.mark.parametrize("level", [1e-300, 1e-20, 1e-10, 0.3, 0.999])
def test_beta_ppf_arcsine_and_small_tails(level: float) -> None:
    # Beta(1/2, 1/2) is the arcsine law; near 0, I_x(1/2, 2) = 1.5 sqrt(x) (1 - x/3).
    assert close(beta_ppf(level, 0.5, 0.5), math.sin(math.pi * level / 2) ** 2)
    if level <= 1e-10:
        assert close(beta_ppf(level, 0.5, 2.0), (level / 1.5) ** 2)


@pytest.mark.parametrize("shape", [10.0, 1e3, 1e5, 1e6])
def test_symmetric_beta_has_median_one_half(shape: float) -> None:
    assert close(beta_ppf(0.5, shape, shape), 0.5)


def test_beta_ppf_endpoints() -> None:
    assert beta_ppf(0.0, 2.0, 3.0) == 0.0
    assert beta_ppf(1.0, 2.0, 3.0) == 1.0
    assert beta_ppf(1e-300, 1e-3, 1.0) == 0.0  # 1e-300000 underflows, as in scipy


@pytest.mark.parametrize(
    "p", [1e-300, 1e-100, 1e-20, 1e-8, 0.001, 0.02, 0.3, 0.5, 0.7, 0.99, 1 - 1e-10]
)
def test_normal_ppf_matches_scipy(p: float) -> None:
    assert math.isclose(normal_ppf(p), float(norm.ppf(p)), rel_tol=TOLERANCE)


@pytest.mark.parametrize("x", [-37.0, -20.0, -8.0, -3.0, -0.5, 0.0, 0.5, 3.0, 8.0])
def test_normal_cdf_matches_scipy_in_both_tails(x: float) -> None:
    assert close(normal_cdf(x), float(norm.cdf(x)))


@settings(max_examples=300, deadline=None)
@given(p=st.floats(min_value=1e-300, max_value=1 - 1e-16))
def test_normal_round_trip_matches_scipy(p: float) -> None:
    assert math.isclose(normal_ppf(p), float(norm.ppf(p)), rel_tol=TOLERANCE, abs_tol=1e-15)
    x = normal_ppf(p)
    assert close(normal_cdf(x), float(norm.cdf(x)))
