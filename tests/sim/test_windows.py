"""Every budget renews at a window boundary, as the published model's does.

The published simulator (mpi-dsg/irreversibility-budget, `simulate(windows=...)`)
starts each window with an empty ledger, empty per-agent partitions, a breaker that is
not halted and fresh rate limits. Its E5 `no_attack` row (3 windows, seeds 5000-5299)
is the multi-window figure we match: budget utility 0.3899 +-0.0036, exposure
315,809 USD = 1.2632 R summed over the windows, last-window utility 0.980.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import metrics, runner, workload
from sim.arms import Breaker, Budget, Cap, Posthoc, Static, Toctou
from sim.experiments import Spec
from sim.params import Model, Scenario

TOL = 2.5  # published mean within 2.5 of our 95% half-widths, as tests/sim/test_reproduction
PUBLISHED_UTILITY = 0.38993
PUBLISHED_EXPOSURE = 315_809.38 / 250_000.0


def test_budget_over_three_windows_matches_published() -> None:
    wl = workload.build(Scenario(Model(windows=3)), range(5000, 5100))
    s = metrics.summarize(metrics.per_seed(wl, runner.run(Budget().build(wl), wl)))
    assert abs(s.utility - PUBLISHED_UTILITY) <= TOL * s.utility_ci, s
    assert abs(s.exposure - PUBLISHED_EXPOSURE) <= TOL * s.exposure_ci, s
    assert s.p_overdraw == 0.0


def _last_window_alone(wl: workload.Workload) -> workload.Workload:
    """The events of wl's last window, moved to a one-window workload of their own."""
    m = wl.model
    first_tick = (m.windows - 1) * m.ticks
    keep = wl.valid & (wl.tick >= first_tick)
    k = max(1, int(keep.sum(axis=1).max()))
    one = replace(m, windows=1)
    arrays: dict[str, np.ndarray] = {}
    for name, pad in (
        ("tick", one.horizon),
        ("agent", 0),
        ("supplier", 0),
        ("value", 0.0),
        ("residual", 0.0),
        ("valid", False),
        ("frag", False),
        ("phase", workload.POST),
    ):
        src = getattr(wl, name)
        out = np.full((src.shape[0], k), pad, dtype=src.dtype)
        for row in range(src.shape[0]):
            picked = src[row][keep[row]]
            out[row, : picked.size] = picked
        arrays[name] = out
    arrays["tick"] = np.where(arrays["valid"], arrays["tick"] - first_tick, one.horizon)
    return replace(
        wl,
        model=one,
        tick=arrays["tick"],
        agent=arrays["agent"],
        supplier=arrays["supplier"],
        value=arrays["value"],
        residual=arrays["residual"],
        valid=arrays["valid"],
        frag=arrays["frag"],
        phase=arrays["phase"],
    )


@pytest.mark.parametrize(
    "spec",
    [Budget(), Cap(), Static(), Breaker(0), Breaker(10), Toctou(10), Posthoc(0)],
    ids=["budget", "cap", "static", "breaker-0", "breaker-10", "toctou-10", "posthoc"],
)
def test_last_window_decides_as_if_it_were_the_first(spec: Spec) -> None:
    """Nothing of an earlier window's spending reaches a later window's decisions."""
    wl = workload.build(Scenario(Model(windows=3)), range(300, 340))
    alone = _last_window_alone(wl)
    whole = runner.run(spec.build(wl), wl).executed
    fresh = runner.run(spec.build(alone), alone).executed
    last = wl.valid & (wl.tick >= 2 * wl.model.ticks)
    for row in range(wl.shape[0]):
        np.testing.assert_array_equal(whole[row][last[row]], fresh[row][alone.valid[row]])
    assert fresh.any()  # the comparison is not vacuous
