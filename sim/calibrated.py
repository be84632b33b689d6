"""Self-calibrating hold prices for the irrev arm, from pricing.calibration.

Every seed keeps, per product line (route), the sufficient statistics of the realised
residual factors its settled holds revealed; every `every` ticks a seed whose evidence
grew re-prices that line with `pricing.calibration.hold_factor`, the function the
gateway's settlement path would use. Prices are computed when an event is decided, so
a hold is priced from the evidence of that moment.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pricing.calibration import TOP_KEPT, Evidence, Prior, hold_factor
from sim.runner import I64, B
from sim.workload import Workload

F64 = npt.NDArray[np.float64]


class Calibrated:
    def __init__(
        self,
        wl: Workload,
        level: float,
        settle_delay: int,
        prior_weight: float,
        pending: float | None,
        every: int,
    ) -> None:
        m = wl.model
        n_seeds, _ = wl.shape
        self.alpha = 1.0 - level
        self.priors = [
            Prior.from_catalog(ln.recovery_a, ln.recovery_b, m.p_comp_fail, level, prior_weight)
            for ln in m.lines
        ]
        # holds pending on one route at once, in calm: the fewest, so the dearest price
        calm_rate = m.n_agents * m.p_base / len(m.lines)
        self.pending = max(calm_rate * settle_delay, 1e-9) if pending is None else pending
        self.every = every
        self.line = np.where(wl.frag, 0, wl.agent % len(m.lines))
        self.face = np.ceil(wl.value * 1e6)
        self.truth = np.where(wl.value > 0, wl.residual / np.where(wl.value > 0, wl.value, 1), 0)
        shape = (n_seeds, len(m.lines))
        self.n = np.zeros(shape, np.int64)
        self.total = np.zeros(shape)
        self.total_sq = np.zeros(shape)
        self.top = np.full((*shape, TOP_KEPT), -1.0)  # descending; -1 is empty
        start = [self._price(p, Evidence()) for p in self.priors]
        self.factor = np.tile(np.array(start), (n_seeds, 1))
        self.stale = np.zeros(n_seeds, bool)
        self.last = np.zeros(n_seeds, np.int64)
        self.rows = np.arange(n_seeds)

    def _price(self, prior: Prior, ev: Evidence) -> float:
        return hold_factor(prior, ev, pending=self.pending, alpha=self.alpha)

    def observe(self, events: I64, posts: B) -> None:
        """Settled holds of `events` (one per seed, where `posts`) reveal their factors."""
        if not posts.any():
            return
        rows, ev = self.rows[posts], events[posts]
        line, f = self.line[rows, ev], self.truth[rows, ev]
        self.n[rows, line] += 1
        self.total[rows, line] += f
        self.total_sq[rows, line] += f * f
        merged = np.concatenate([self.top[rows, line], f[:, None]], axis=1)
        self.top[rows, line] = -np.sort(-merged, axis=1)[:, :TOP_KEPT]
        self.stale[rows] = True

    def price(self, k: int, t: I64) -> I64:
        """(S,) micro-USD hold of event k at tick t, from the evidence so far."""
        due = self.stale & (t - self.last >= self.every)
        for s in np.flatnonzero(due):
            for j, prior in enumerate(self.priors):
                top = tuple(float(x) for x in self.top[s, j] if x >= 0)
                ev = Evidence(int(self.n[s, j]), self.total[s, j], self.total_sq[s, j], top)
                self.factor[s, j] = self._price(prior, ev)
        self.stale &= ~due
        self.last = np.where(due, t, self.last)
        factor = self.factor[self.rows, self.line[:, k]]
        return np.ceil(self.face[:, k] * factor).astype(np.int64)
