"""Upper bounds on the utility of any gate that keeps a window's realised loss within R.

Utility is executed over proposed value. Louder or longer bursts multiply what is
proposed while R stays, so past some burst no gate that keeps R can reach a given
utility, however it decides. Two bounds per seed, over the events the per-call value
cap lets through (the per-agent rate limit is left out: 20 executions per agent cost
far more than R in these worlds):

- `clairvoyant`: a gate that knows every realised residual in advance executes the
  events of least residual per unit value first (a fractional knapsack); nothing
  that keeps R executes more value. Rigorous, per seed.
- `blind`: a gate that sees an event's value and regime but not its recovery. Each
  event's residual factor is then independent of whether it is admitted, so the
  residual it admits has expectation (value admitted) x (the regime's mean factor),
  and keeping R on average allows at most calm value first, then burst value, up to
  R in expectation. A bound on what such a gate admits in expectation, per seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim import workload
from sim.params import Model, Scenario
from sim.workload import BURST, Workload

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class UtilityBounds:
    clairvoyant: F64  # (S,)
    blind: F64  # (S,)


def utility_bounds(wl: Workload) -> UtilityBounds:
    """Both bounds for every seed of a one-window workload of one product line."""
    m = wl.model
    if m.windows != 1 or len(m.lines) != 1 or m.spike is not None:
        raise ValueError("utility bounds are for one window of one product line, no spike")
    if m.misprice != 1.0 or m.p_comp_fail != 0.0:
        raise ValueError("utility bounds assume a world as priced, compensation never failing")
    ok = wl.valid & ~wl.frag & (wl.value <= m.value_cap)
    value = np.where(ok, wl.value, 0.0)
    residual = np.where(ok, wl.residual, 0.0)
    proposed = value.sum(axis=1)
    r = m.tolerance
    # clairvoyant: least residual per unit value first, the last one in part
    factor = np.where(ok, residual / np.where(ok, value, 1.0), np.inf)
    order = np.argsort(factor, axis=1, kind="stable")
    v, res = np.take_along_axis(value, order, 1), np.take_along_axis(residual, order, 1)
    spent = np.cumsum(res, axis=1) - res  # residual of the events before each
    part = np.clip((r - spent) / np.where(res > 0, res, 1.0), 0.0, 1.0)
    part = np.where(res > 0, part, np.where(spent <= r, 1.0, 0.0))
    clairvoyant = (v * part).sum(axis=1)
    # blind: the regimes' mean residual factors, calm value first
    line = m.lines[0]
    a, b = line.world_shape
    calm_mean = b / (a + b)
    burst_mean = m.corr_b / (m.corr_a + m.corr_b) if m.correlated else calm_mean
    burst = wl.phase == BURST
    calm_v, burst_v = (value * ~burst).sum(axis=1), (value * burst).sum(axis=1)
    room = r - calm_v * calm_mean
    blind = np.where(
        room <= 0, r / calm_mean, calm_v + np.minimum(burst_v, np.maximum(room, 0) / burst_mean)
    )
    safe = np.where(proposed > 0, proposed, 1.0)
    return UtilityBounds(
        np.where(proposed > 0, clairvoyant / safe, 1.0),
        np.where(proposed > 0, blind / safe, 1.0),
    )


BURST_SWEEP = ((1.0, 50), (2.0, 50), (1.0, 200), (2.0, 200))  # (x 0.05 rate, ticks)


def burst_sweep(agents: int, seeds: int, seed0: int, block: int = 100) -> list[dict[str, float]]:
    """Mean bounds over `seeds` seeds from `seed0` in each correlated regime of
    `irrev sim corr --burst-mult X --burst-len N` (the same workloads, built in blocks)."""
    out = []
    for mult, length in BURST_SWEEP:
        model = Model(n_agents=agents, correlated=True, p_burst=0.05 * mult, burst_len=length)
        parts = [
            utility_bounds(workload.build(Scenario(model), range(s, min(s + block, seed0 + seeds))))
            for s in range(seed0, seed0 + seeds, block)
        ]
        clair = np.concatenate([p.clairvoyant for p in parts])
        blind = np.concatenate([p.blind for p in parts])
        out.append(
            {
                "burst_mult": mult,
                "burst_len": length,
                "clairvoyant": float(clair.mean()),
                "clairvoyant_max": float(clair.max()),
                "blind": float(blind.mean()),
            }
        )
    return out
