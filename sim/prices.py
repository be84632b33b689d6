"""Hold prices for the irrev arms, from pricing/'s quantile and stressed LGD functions.

Prices are priced from the catalog class of the route (the product line), never from
the agent's declaration: a fragment misdeclared as refundable pays the purchase price.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pricing.models import quantile_lgd, stressed_lgd
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


def stress_signal(wl: Workload, cfg: Irrev) -> B:
    """(S, K): is the fleet's recent request rate abnormal when event k arrives?

    Observable only: requests the gateway saw in the last `signal_window` ticks before
    this one (valid events, fragments included), against `signal_mult` times the calm
    expectation (at least 2). Once tripped it stays on for `stress_hold` ticks.
    """
    m, w = wl.model, cfg.signal_window
    first = row_searchsorted(wl.tick, wl.tick - w, "left")
    recent = np.arange(wl.shape[1])[None, :] - first
    threshold = max(2.0, cfg.signal_mult * m.p_base * m.n_agents * w)
    trip = wl.valid & (recent >= threshold)
    last_trip = np.maximum.accumulate(np.where(trip, wl.tick, -(10**9)), axis=1)
    return np.asarray(wl.tick - last_trip <= cfg.stress_hold)
