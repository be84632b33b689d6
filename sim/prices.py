"""Hold prices for the irrev arms, from pricing/'s quantile and stressed LGD functions.

Prices are priced from the catalog class of the route (the product line), never from
the agent's declaration: a fragment misdeclared as refundable pays the purchase price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pricing import (
    Cusum,
    CusumState,
    cusum_step,
    quantile_lgd,
    stressed_lgd,
    trip_threshold,
)
from sim.runner import I64, B, row_searchsorted
from sim.workload import F64, Workload

if TYPE_CHECKING:
    from sim.irrev import Irrev

# Each seed's stream of the CUSUM's warm-up history, beside its workload's own
# (sim/workload.py: the seed, and [seed, ATTACK_STREAM_TAG]).
CALM_HISTORY_TAG = 999_979


def _line_factors(wl: Workload, cfg: Irrev, stressed: bool) -> npt.NDArray[np.float64]:
    p_fail = wl.model.p_comp_fail
    out = []
    for ln in wl.model.lines:
        a, b = ln.recovery_a, ln.recovery_b
        if cfg.price_factor is not None and not stressed:
            out.append(cfg.price_factor)
        elif stressed:
            out.append(stressed_lgd(a, b, p_fail, cfg.rho, cfg.stress_quantile, cfg.hold_quantile))
        else:
            out.append(quantile_lgd(a, b, p_fail, cfg.hold_quantile))
    return np.array(out)


def hold_prices(wl: Workload, cfg: Irrev, stressed: B) -> I64:
    """(S, K) int64 micro-USD: face value times the LGD factor, rounded up once."""
    line = np.where(wl.frag, 0, wl.agent % len(wl.model.lines))
    calm = _line_factors(wl, cfg, stressed=False)[line]
    hot = _line_factors(wl, cfg, stressed=True)[line]
    hot = np.maximum(np.maximum(calm, hot), cfg.stress_floor)
    factor = np.where(stressed, hot, calm)
    face = np.ceil(wl.value * 1e6)
    return np.ceil(face * factor).astype(np.int64)


@dataclass(frozen=True)
class StressSignal:
    """The detector's view of every event, both (S, K)."""

    on: B  # the event is priced stressed: a trip within `stress_hold` ticks before it
    # a trip after the event counted it: it arrived in the detector's blind spot, the
    # requests that trip it; its margin stays until it settles (pricing/stress.py)
    counted: B
    # the tick from which no trip can count the event (pricing.stress.vouched_at)
    vouch_tick: I64


def stress_signal(wl: Workload, cfg: Irrev) -> StressSignal:
    """Is the fleet's recent request rate abnormal when event k arrives, and will a
    trip count event k?

    Observable only: requests the gateway saw in the last `signal_window` ticks before
    this one (valid events, fragments included), against pricing's `trip_threshold`.
    Once tripped it stays on for `stress_hold` ticks. `counted` looks ahead, but only
    to trips at most `signal_window` ticks later: the arm reads it no earlier than
    `vouched_at`, when every such trip has happened.
    """
    m, w = wl.model, cfg.signal_window
    first = row_searchsorted(wl.tick, wl.tick - w, "left")
    recent = np.arange(wl.shape[1])[None, :] - first
    threshold = trip_threshold(m.p_base * m.n_agents, w, cfg.signal_mult)
    trip = wl.valid & (recent >= threshold)
    last_trip = np.maximum.accumulate(np.where(trip, wl.tick, -(10**9)), axis=1)
    on = np.asarray(wl.tick - last_trip <= cfg.stress_hold)
    # event k is counted by a trip j > k whose window starts at or before k: the
    # smallest window start of the trips after k, against k
    starts = np.where(trip, first, np.iinfo(np.int64).max)
    after = np.minimum.accumulate(starts[:, ::-1], axis=1)[:, ::-1]
    later = np.concatenate([after[:, 1:], np.full((wl.shape[0], 1), np.iinfo(np.int64).max)], 1)
    counted = later <= np.arange(wl.shape[1])[None, :]
    return StressSignal(on, counted, wl.tick + w + 1)


def cusum_signal(wl: Workload, cfg: Irrev) -> StressSignal:
    """The CUSUM detector's view of every event (pricing/stress.py): the score decays
    by cusum_decay per tick at the detector's own calm rate and each request adds
    cusum_jump; at `cusum_h` it alarms, prices stressed for `stress_hold` ticks and
    restarts. An event is counted if the run of the score it raised alarms, and
    vouched for from cusum_run_end if that run decays to 0 first (a run still open
    when the window ends is never vouched for: its margin stays until settlement)."""
    n_seeds, n_events = wl.shape
    cusum = _Cusum(wl, cfg)
    on = np.zeros(wl.shape, bool)
    run_of = np.zeros(wl.shape, np.int64)
    for k in range(n_events):
        on[:, k], run_of[:, k] = cusum.step(wl.tick[:, k], wl.valid[:, k])
    rows = np.arange(n_seeds)[:, None]
    return StressSignal(on, cusum.alarmed[rows, run_of], cusum.end[rows, run_of])


class _Cusum:
    """One CUSUM per seed, stepped one event (one request per seed) at a time by
    pricing's `cusum_step`, the transition a gateway's detector makes."""

    def __init__(self, wl: Workload, cfg: Irrev) -> None:
        n_seeds, n_events = wl.shape
        self.cusum = Cusum(cfg.cusum_shift, cfg.cusum_h, cfg.stress_hold)
        # the warm-up: `calm_history` ticks of the world's calm requests before the window
        history = cfg.calm_history * wl.model.p_base * wl.model.n_agents
        requests = np.array(
            [np.random.default_rng([s, CALM_HISTORY_TAG]).poisson(history) for s in wl.seeds],
            np.float64,
        )
        zero: F64 = np.zeros(n_seeds)
        self.state: CusumState[F64] = CusumState.warmed(
            requests, zero + cfg.calm_history, start=zero
        )
        self.rows = np.arange(n_seeds)
        never = np.iinfo(np.int64).max // 2
        # by run: the tick from which its requests are vouched for, and did it alarm
        self.end = np.full((n_seeds, n_events + 1), never, np.int64)
        self.alarmed = np.zeros((n_seeds, n_events + 1), bool)

    def step(self, tick: I64, valid: B) -> tuple[B, I64]:
        """The event at `tick` (where `valid`): is it priced stressed, and its run."""
        self.state, step = cusum_step(self.state, tick.astype(np.float64), valid, self.cusum, np)
        run = np.asarray(step.run, np.int64)
        # a run that ended or alarmed is the one before this event's
        done = step.ended | step.alarm
        closed = self.rows[done], (run - 1)[done]
        self.end[closed] = np.where(step.alarm, tick, np.asarray(step.ended_at))[done]
        self.alarmed[closed] = step.alarm[done]
        return step.on, run
