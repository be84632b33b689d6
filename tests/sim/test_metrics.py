from __future__ import annotations

import numpy as np
import pytest

from sim.metrics import mean_ci, quantile_ci, wilson
from sim.report import pareto_verdicts


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [(0, 300, 0.0, 0.01264), (300, 300, 0.98736, 1.0), (5, 10, 0.23659, 0.76341)],
    ids=["none", "all", "half"],
)
def test_wilson_matches_known_intervals(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_rejects_empty_sample() -> None:
    with pytest.raises(ValueError):
        wilson(0, 0)


def test_mean_ci_is_normal_half_width() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    mean, half = mean_ci(x)
    assert mean == 2.5
    assert half == pytest.approx(1.959964 * x.std(ddof=1) / 2)


def test_mean_ci_of_one_sample_has_no_width() -> None:
    assert mean_ci(np.array([3.0])) == (3.0, 0.0)


def test_the_quantile_interval_covers_the_true_quantile_about_95_percent() -> None:
    """Of 2,000 samples of 1,000 uniform draws, the 0.99 quantile's interval holds the
    true 0.99 in 93-98.5% (an order-statistic interval is a little conservative)."""
    rng = np.random.default_rng(28)
    covered = 0
    for _ in range(2000):
        _, lo, hi = quantile_ci(rng.random(1000), 0.99)
        covered += lo <= 0.99 <= hi
    assert 0.93 <= covered / 2000 <= 0.985


def test_the_quantile_interval_is_order_statistics_around_the_quantile() -> None:
    x = np.arange(1000, dtype=np.float64)  # x[i] = i: ranks are values
    q, lo, hi = quantile_ci(x, 0.99)
    assert q == pytest.approx(989.01)
    # n q = 990, z (n q (1 - q))^0.5 = 6.17: ranks 983 and 997 (1-based)
    assert (lo, hi) == (982.0, 996.0)


def test_the_verdict_compares_the_99th_percentile_not_the_maximum() -> None:
    """One seed's worst window makes the maximum; the verdict ignores it."""
    base = {"case": "c", "utility": 0.3, "p_overdraw": 0.0, "exposure_max": 0.7}
    rows = [
        {**base, "arm": "budget", "worst_q99": 0.66},
        {**base, "arm": "irrev", "worst_q99": 0.65, "exposure_max": 0.99},
    ]
    [verdict] = pareto_verdicts(rows)
    assert verdict["worst_q99"] and verdict["holds"]
    rows[1]["worst_q99"] = 0.67
    assert not pareto_verdicts(rows)[0]["holds"]
