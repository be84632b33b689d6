"""The irrev-cal arm's pending count and what pooling over it buys (sim/calibrated.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ledger import OpenPool
from sim import metrics, runner, workload
from sim.calibrated import Calibrated, Pricing
from sim.irrev import Irrev
from sim.params import Model, Scenario


def _cal(seeds: range) -> tuple[workload.Workload, Calibrated]:
    wl = workload.build(Scenario(Model()), seeds)
    return wl, Calibrated(wl, 0.999, Pricing(), None, 10)


def test_a_hold_on_an_idle_route_stands_alone() -> None:
    wl, cal = _cal(range(4))
    np.testing.assert_array_equal(cal.pending_at(cal.line[:, 0], wl.value[:, 0]), 1.0)


def test_open_holds_count_by_kish_effective_number_and_closing_them_frees_the_route() -> None:
    wl, cal = _cal(range(4))
    every = np.ones(4, bool)
    cal.opened(0, every)
    cal.opened(1, every)
    v = wl.value[:, :3]
    expected = v.sum(1) ** 2 / (v**2).sum(1)  # 3 for equal values, fewer for unequal
    np.testing.assert_allclose(cal.pending_at(cal.line[:, 2], v[:, 2]), expected, rtol=1e-12)
    assert (expected <= 3.0 + 1e-12).all()
    cal.closed(np.zeros(4, np.int64), every)
    cal.observe(np.ones(4, np.int64), every)  # a settlement closes its hold too
    np.testing.assert_allclose(cal.pending_at(cal.line[:, 2], v[:, 2]), 1.0)


def test_the_gateways_open_set_counts_as_the_simulators() -> None:
    """The ledger's open set of a route (count, face sum, sum of squares: what the
    gateway prices from) gives the simulator's pending count for the same holds."""
    wl, cal = _cal(range(4))
    every = np.ones(4, bool)
    cal.opened(0, every)
    cal.opened(1, every)
    sim = cal.pending_at(cal.line[:, 2], wl.value[:, 2])
    for s in range(4):
        a, b, c = (int(v) for v in cal.face[s, :3])  # micro-USD, as the ledger counts
        pool = OpenPool(2, a + b, float(a * a + b * b))
        assert pool.effective(c) == pytest.approx(sim[s], rel=1e-5)


def test_a_fixed_pending_is_what_a_gateway_policy_says() -> None:
    wl = workload.build(Scenario(Model()), range(3))
    cal = Calibrated(wl, 0.999, Pricing(), 4.0, 10)
    cal.opened(0, np.ones(3, bool))
    np.testing.assert_array_equal(cal.pending_at(cal.line[:, 1], wl.value[:, 1]), 4.0)


@pytest.mark.parametrize("misprice", [1.0, 1.5])
def test_pooling_over_the_holds_open_in_a_burst_admits_more_and_still_holds_r(
    misprice: float,
) -> None:
    """d = 200: a burst's holds are all pending at once; pooled on the route's own
    settled mean, they admit more than holds priced alone (pending = 1), with no
    overdraw, in a world as priced and in one half again as lossy."""
    wl = workload.build(Scenario(Model(misprice=misprice)), range(2000, 2060))

    def outcome(pending: float | None) -> dict[str, np.ndarray]:
        arm = Irrev(settle_delay=200, calibrate=True, pending=pending)
        return metrics.per_seed(wl, runner.run(arm.build(wl), wl))

    pooled, alone = outcome(None), outcome(1.0)
    assert pooled["overdraw"].sum() == 0
    assert pooled["utility"].mean() > alone["utility"].mean()


def test_a_policys_cap_bounds_the_open_count() -> None:
    """calibrate.pending as a cap: the open holds count at most that many."""
    wl = workload.build(Scenario(Model()), range(3))
    cal = Calibrated(wl, 0.999, Pricing(), None, 10, cap=1.5)
    every = np.ones(3, bool)
    cal.opened(0, every)
    cal.opened(1, every)
    assert (cal.pending_at(cal.line[:, 2], wl.value[:, 2]) <= 1.5).all()
