"""Mispriced worlds: the realised residual is k times what the catalog prices."""

from __future__ import annotations

import numpy as np
import pytest

from sim import workload
from sim.params import Attack, Model, Scenario


def test_scale_multiplies_every_residual_up_to_face_value() -> None:
    plain = workload.build(Scenario(attack=Attack()), range(10, 30))
    worse = workload.build(Scenario(Model(misprice=2.5), Attack()), range(10, 30))
    np.testing.assert_array_equal(worse.value, plain.value)
    expected = np.minimum(plain.value, 2.5 * plain.residual)
    np.testing.assert_allclose(worse.residual, expected, rtol=1e-12)
    assert (worse.residual[worse.frag] > plain.residual[worse.frag]).any()


def test_shape_draws_another_beta_with_k_times_the_mean_residual() -> None:
    wl = workload.build(Scenario(Model(misprice=3.0, misprice_shape="shape")), range(200))
    factor = wl.residual[wl.valid] / wl.value[wl.valid]
    # Beta(6, 2) has mean residual 0.25; three times that is Beta(2, 6)'s 0.75
    assert factor.mean() == pytest.approx(0.75, abs=0.01)
    assert factor.max() <= 1.0


@pytest.mark.parametrize("k", [0.0, -1.0, float("nan")])
def test_a_factor_that_is_not_positive_is_refused(k: float) -> None:
    with pytest.raises(ValueError, match="misprice"):
        Model(misprice=k)


def test_shape_refuses_a_mean_no_beta_has() -> None:
    with pytest.raises(ValueError, match="no Beta"):
        Model(misprice=4.0, misprice_shape="shape")


def test_self_calibration_holds_the_limit_in_a_world_twice_as_lossy() -> None:
    """Uncalibrated, irrev's catalog-priced holds overrun a 2x world and overdraw; priced
    from their route's settled evidence, they do not (seeds 1000-1099, two windows)."""
    from sim import metrics, runner
    from sim.irrev import Irrev

    wl = workload.build(Scenario(Model(misprice=2.0, windows=2)), range(1000, 1100))
    plain = metrics.per_seed(wl, runner.run(Irrev().build(wl), wl))["overdraw"].sum()
    arm = Irrev(calibrate=True).build(wl)
    calibrated = metrics.per_seed(wl, runner.run(arm, wl))["overdraw"].sum()
    assert plain >= 5
    assert calibrated == 0
    # learnt: a hold standing alone is held at face value
    assert arm.cal is not None and all(q.tail == 1.0 for qs in arm.cal.quotes for q in qs)
