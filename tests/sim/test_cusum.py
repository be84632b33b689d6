"""The CUSUM burst detector (pricing/stress.py, sim/prices.py): a quiet burst that a
5-tick count never sees is caught, the requests of the run that alarms are counted
(their margins stay), and a lone calm request is vouched for when its run decays."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pricing import calm_rate, cusum_decay, cusum_jump, cusum_run_end
from sim.experiments import EXPERIMENTS, World, run_case
from sim.irrev import Irrev
from sim.params import Model
from sim.prices import cusum_signal, stress_signal
from sim.workload import PRE, Workload

# 50 agents at the calm p_base 0.0005: 0.025 requests a tick, one every 40 ticks.
CALM = Model(n_agents=50).p_base * 50
QUIET = 8  # one request every 8 ticks: 5x the calm rate, never 2 within 5 ticks
LONE = 2000


def _workload(ticks: list[int]) -> Workload:
    tick = np.array([ticks], np.int64)
    shape = tick.shape
    return Workload(
        model=Model(n_agents=50),
        attack=None,
        seeds=(0,),
        burst_start=np.array([100]),
        tick=tick,
        agent=np.zeros(shape, np.int64),
        supplier=np.zeros(shape, np.int64),
        value=np.ones(shape),
        residual=np.ones(shape),
        valid=np.ones(shape, bool),
        frag=np.zeros(shape, bool),
        phase=np.full(shape, PRE, np.int8),
    )


# A warm-up long enough that the estimated calm rate is the true one to 0.1%.
CUSUM = Irrev(stressed=True, detector="cusum", cusum_shift=4.0, calm_history=10**8)


def test_the_score_arithmetic() -> None:
    assert cusum_jump(4.0) == pytest.approx(math.log(4))
    assert cusum_decay(CALM, 4.0) == pytest.approx(0.075)
    assert calm_rate(25.0, 1000.0) == CALM
    # a score of 1 decaying 0.3 a tick from tick 10 is gone at tick 14 (10 + 3.33)
    assert cusum_run_end(10.0, 1.0, 0.3) == 14
    ends = cusum_run_end(np.array([10.0, 0.0]), np.array([1.0, 0.6]), np.array([0.3, 0.3]), np)
    assert ends.tolist() == [14, 2]
    with pytest.raises(ValueError, match="shift"):
        cusum_jump(1.0)


def test_a_quiet_burst_the_rate_count_misses_is_caught() -> None:
    ticks = [100 + QUIET * i for i in range(75)]  # 600 ticks at 5x calm
    wl = _workload(ticks)
    rate = stress_signal(wl, Irrev(stressed=True, detector="rate"))
    cusum = cusum_signal(wl, CUSUM)
    assert not rate.on.any(), "a 5-tick count saw requests 8 ticks apart"
    # each request adds ln 4 = 1.39 and 8 ticks take 0.6 off: the k-th request (from 0)
    # finds a score of 0.79 k, 4 or more at k = 6, which is priced stressed, as is all
    # that follows within the hold
    first = int(np.argmax(cusum.on[0]))
    assert cusum.on[0, first:].all() and first == 6, cusum.on[0]
    # the six that raised the alarming score were priced calm, and are counted
    assert cusum.counted[0, :first].all()


def test_a_lone_calm_request_is_vouched_for_when_its_run_decays() -> None:
    cusum = cusum_signal(_workload([LONE, LONE + 400]), CUSUM)
    assert not cusum.on.any() and not cusum.counted.any()
    # ln 4 / 0.075 = 18.5 ticks: its run is over at tick LONE + 19
    assert cusum.vouch_tick[0, 0] == LONE + 19
    # the last request's run is still open when the window ends: never vouched for
    assert cusum.vouch_tick[0, 1] > 10**12


@pytest.mark.slow
def test_the_quiet_burst_check() -> None:
    """issue 28's held-back check, on one block: `irrev sim corr --agents 50 --seeds
    1000 --burst-len 600 --burst-mult 0.05` gives irrev-stressed with the CUSUM
    detector P(overdraw) <= 0.5%."""
    world = World(p_burst=0.05 * 0.05, burst_len=600, detector="cusum")
    case = world.apply(EXPERIMENTS["corr"]((50,))).cases[0]
    case = replace(case, seed0=986000, arms=tuple(a for a in case.arms if a[0] == "irrev-stressed"))
    [row] = run_case(case, 1000)
    assert row["arm"] == "irrev-stressed"
    assert row["p_overdraw"] <= 0.005, row  # type: ignore[operator]
