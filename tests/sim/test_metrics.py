from __future__ import annotations

import numpy as np
import pytest

from sim.metrics import mean_ci, wilson


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
