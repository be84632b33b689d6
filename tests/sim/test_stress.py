"""irrev-stressed's blind-spot margin (pricing/stress.py) on a small hand-made fleet.

A request-rate detector trips only after `trip_threshold` requests: the requests that
trip it were priced calm. One seed, R = 80 USD, two burst-time purchases of 50 USD
whose residual (45) overruns the calm q_0.999 price (38.13) and a third that trips the
detector: priced calm without a margin both fit and the window overdraws; with it, a
calm hold must fit at its stressed price (face value), so the second is refused, and
the first keeps its margin to settlement because the trip counted it. A lone purchase
later keeps its margin only until the detector's window has passed it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pricing.stress import stress_margin, trip_threshold, vouched_at
from sim import metrics, runner
from sim.bounds import utility_bounds
from sim.irrev import Irrev, _IrrevArm
from sim.params import Model
from sim.runner import B
from sim.workload import BURST, PRE, Workload

# (tick, value, residual) in USD; 50 agents calm: the detector trips at 2 requests
EVENTS = [
    (100, 50.0, 45.0),  # the burst's first request: priced calm, overruns it
    (101, 50.0, 45.0),  # the second: fits at 38.13 beside the first, not at 50
    (101, 50.0, 45.0),  # trips: 2 requests in ticks 96..101 before it; priced at face
    (110, 10.0, 2.0),  # while stressed; the first's margin is still held
    (300, 30.0, 10.0),  # calm again, alone: its margin lives through tick 305
    (310, 5.0, 1.0),  # by now vouched for: the margin is back
]


def _workload() -> Workload:
    model = Model(n_agents=50, tolerance=80.0)
    tick, value, residual = (np.array([[e[i] for e in EVENTS]]) for i in range(3))
    shape = tick.shape
    return Workload(
        model=model,
        attack=None,
        seeds=(0,),
        burst_start=np.array([100]),
        tick=tick.astype(np.int64),
        agent=np.arange(shape[1])[None, :],
        supplier=np.zeros(shape, np.int64),
        value=value.astype(np.float64),
        residual=residual.astype(np.float64),
        valid=np.ones(shape, bool),
        frag=np.zeros(shape, bool),
        phase=np.full(shape, PRE, np.int8),
    )


class _Seen:
    """Records the tenant's pending + posted as each event is decided."""

    def __init__(self, arm: _IrrevArm) -> None:
        self.arm, self.balance = arm, list[int]()

    def decide(self, k: int, live: B) -> tuple[B, B]:
        out = self.arm.decide(k, live)
        self.balance.append(int(self.arm.balance[0, 0]))
        return out

    def commit(self, k: int, executed: B) -> None:
        self.arm.commit(k, executed)


def _run(blind_margin: bool) -> tuple[_IrrevArm, _Seen, runner.Outcome]:
    wl = _workload()
    spec = Irrev(
        stressed=True,
        detector="rate",
        blind_margin=blind_margin,
        soft_frac=1.0,
        agent_limit_frac=None,
    )
    seen = _Seen(spec.build(wl))
    return seen.arm, seen, runner.run(seen, wl)


def test_without_the_margin_the_blind_spot_overdraws() -> None:
    arm, _, out = _run(blind_margin=False)
    # both blind-spot holds fit at 38.13; their 45 + 45 then leave no room for anything
    assert out.executed[0].tolist() == [True, True, False, False, False, False]
    per_seed = metrics.per_seed(_workload(), out)
    assert per_seed["worst_window"][0] == pytest.approx(90 / 80)
    assert arm.overruns[0] == 2


def test_the_margin_refuses_what_only_fits_at_calm_prices() -> None:
    arm, seen, out = _run(blind_margin=True)
    assert arm.counted is not None  # the margin's counted holds: kept with blind_margin
    calm, face = int(arm.price[0, 0]), int(arm.hot[0, 0])
    assert (calm, face) == (38_126_079, 50_000_000)  # q_0.999 of Beta(6, 2)'s residual
    assert out.executed[0].tolist() == [True, False, False, True, True, True]
    per_seed = metrics.per_seed(_workload(), out)
    assert per_seed["overdraw"][0] == 0.0
    # the trip at event 2 counted event 0: its margin stays until it settles (tick 120)
    assert seen.balance[3] == face  # 38.13 held + 11.87 margin, at tick 110
    assert arm.counted[0].tolist()[:2] == [True, True]
    # the lone purchase at tick 300 was vouched for at tick 306: its margin went back
    posted = 45_000_000 + 2_000_000
    assert seen.balance[4] == posted
    assert seen.balance[5] == posted + int(arm.price[0, 4])
    assert not arm.counted[0, 4]
    # margins left: the first's went back when it settled, the lone one's when it was
    # vouched for; only the last purchase's, not yet vouched for when the run ends
    last = int(arm.hot[0, 5] - arm.price[0, 5])
    assert arm.margin[0].tolist() == [0, 0, 0, 0, 0, last]


def test_pricing_rules() -> None:
    assert trip_threshold(0.5, 5, 4.0) == 10.0  # N = 1000's calm 0.5 requests a tick
    assert trip_threshold(0.025, 5, 4.0) == 2.0  # N = 50: never below 2
    assert stress_margin(38, 50) == 12
    assert stress_margin(50, 50) == 0
    assert stress_margin(60, 50) == 0  # a learnt price above the stressed one
    assert vouched_at(300, 5) == 306
    with pytest.raises(ValueError, match="window 0 must be >= 1"):
        trip_threshold(0.5, 0, 4.0)


def test_utility_bounds_by_hand() -> None:
    """Least residual per unit value first: 10, 5, 30 and 50 USD whole (residual 58),
    then 22 of the next 45 (24.44 USD of value) of the 195 proposed. Blind to
    recovery, with the three 50s burst-time (mean factor 0.75): the 45 calm (11.25
    expected) and 68.75 / 0.75 of burst value."""
    wl = _workload()
    wl = replace(
        wl,
        model=replace(wl.model, correlated=True),
        phase=np.where(np.arange(6) < 3, BURST, PRE).astype(np.int8)[None, :],
    )
    got = utility_bounds(wl)
    assert got.clairvoyant[0] == pytest.approx((95 + 22 / 45 * 50) / 195)
    assert got.blind[0] == pytest.approx((45 + 68.75 / 0.75) / 195)
    with pytest.raises(ValueError, match="world as priced"):
        utility_bounds(replace(wl, model=replace(wl.model, misprice=2.0)))
