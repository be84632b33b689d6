from __future__ import annotations

import numpy as np
import pytest

from sim import metrics, runner, workload
from sim.arms import Budget, Local
from sim.experiments import E1_ARMS
from sim.params import Attack, Model, Scenario


def _metrics(sc: Scenario, seeds: range) -> dict[str, dict[str, np.ndarray]]:
    wl = workload.build(sc, seeds)
    return {name: metrics.per_seed(wl, runner.run(s.build(wl), wl)) for name, s in E1_ARMS}


def test_same_seed_same_numbers() -> None:
    a, b = _metrics(Scenario(), range(5, 25)), _metrics(Scenario(), range(5, 25))
    for arm in a:
        for key in a[arm]:
            np.testing.assert_array_equal(a[arm][key], b[arm][key], err_msg=f"{arm}.{key}")


def test_seed_results_do_not_depend_on_the_batch() -> None:
    alone = _metrics(Scenario(), range(7, 8))
    batch = _metrics(Scenario(), range(3, 10))
    for arm in alone:
        assert alone[arm]["exposure"][0] == pytest.approx(batch[arm]["exposure"][4], rel=1e-12)


def test_attack_stream_leaves_honest_workload_unchanged() -> None:
    plain = workload.build(Scenario(), range(40, 50))
    attacked = workload.build(Scenario(Model(), Attack()), range(40, 50))
    for row in range(10):
        honest = attacked.valid[row] & ~attacked.frag[row]
        n = int(plain.valid[row].sum())
        np.testing.assert_array_equal(attacked.value[row][honest], plain.value[row][:n])
        np.testing.assert_array_equal(attacked.residual[row][honest], plain.residual[row][:n])


def test_arms_are_paired_on_one_workload() -> None:
    wl = workload.build(Scenario(), range(100, 130))
    local = runner.run(Local().build(wl), wl)
    budget = runner.run(Budget().build(wl), wl)
    # the same proposals reach both gates; only the decisions differ
    np.testing.assert_array_equal(local.gated, local.gated & wl.valid)
    assert (budget.executed <= local.gated).all()
    first_denial = np.argmax(budget.gated & ~budget.executed, axis=1)
    for row, k in enumerate(first_denial):
        np.testing.assert_array_equal(budget.executed[row, :k], local.executed[row, :k])
