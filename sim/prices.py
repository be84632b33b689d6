"""Hold prices for the irrev arms, from pricing/'s quantile and stressed LGD functions.

Prices are priced from the catalog class of the route (the product line), never from
the agent's declaration: a fragment misdeclared as refundable pays the purchase price.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pricing import quantile_lgd, stressed_lgd, trip_threshold
from sim.runner import I64, B, row_searchsorted
from sim.workload import Workload

if TYPE_CHECKING:
    from sim.irrev import Irrev


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
    return StressSignal(on, counted)
