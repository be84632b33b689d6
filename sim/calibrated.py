"""Self-calibrating hold prices for the irrev arm, from pricing.calibration.

Every seed keeps, per product line (route), the sufficient statistics of the realised
residual factors its settled holds revealed; every `every` ticks a seed whose evidence
grew re-quotes that line with `pricing.calibration.route_quote`, the function behind the
gateway's `hold_factor`. A hold is priced when its event is decided, from the quote of
that moment and the holds then pending on its route: by default as many as its route
has open (counted by face value, Kish's effective number (sum v)^2 / sum v^2, so one
large hold among small ones counts for about one), as the gateway counts them from
the ledger (ledger.OpenPool), or a fixed number.

A route's prior is its catalog recovery with `Pricing.p_fail`, the failure rate the
route is priced with: a policy's, not the world's (`irrev sim run` simulates worlds
whose compensation fails more often than the policy believes, which the prior must
not know). Its confidence and surcharge are the policy's too, as the gateway's
`route_pooling` has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pricing import TOP_KEPT, Evidence, Prior, RouteQuote, route_quote
from sim.runner import I64, B
from sim.workload import Workload

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """How a calibrating route is priced: the prior's chance that compensation fails
    (None: the world's, where catalog and world agree on it), the prior's weight in
    settlements, the confidence of its bounds, and the surcharge on every price."""

    p_fail: float | None = None
    prior_weight: float = 20.0
    confidence: float = 0.95
    surcharge: float = 0.0


class Calibrated:
    def __init__(
        self,
        wl: Workload,
        level: float,
        spec: Pricing,
        pending: float | None,
        every: int,
        cap: float = math.inf,
    ) -> None:
        m = wl.model
        n_seeds, _ = wl.shape
        self.alpha = 1.0 - level
        p_fail = m.p_comp_fail if spec.p_fail is None else spec.p_fail
        self.priors = [
            Prior.from_catalog(ln.recovery_a, ln.recovery_b, p_fail, level, spec.prior_weight)
            for ln in m.lines
        ]
        self.confidence, self.markup = spec.confidence, 1.0 + spec.surcharge
        self.pending = pending
        self.cap = cap
        self.every = every
        self.line = np.where(wl.frag, 0, wl.agent % len(m.lines))
        self.face = np.ceil(wl.value * 1e6)
        self.value = wl.value  # USD: its squares' sums stay exact enough in float
        self.truth = np.where(wl.value > 0, wl.residual / np.where(wl.value > 0, wl.value, 1), 0)
        shape = (n_seeds, len(m.lines))
        self.n = np.zeros(shape, np.int64)
        self.total = np.zeros(shape)
        self.total_sq = np.zeros(shape)
        self.top = np.full((*shape, TOP_KEPT), -1.0)  # descending; -1 is empty
        start = [self._quote(p, Evidence()) for p in self.priors]
        self.quotes: list[list[RouteQuote]] = [list(start) for _ in range(n_seeds)]
        # holds open on each route (admitted or awaiting a human, not yet settled):
        # the sums of their face values and of its squares
        self.open_v = np.zeros(shape)
        self.open_v2 = np.zeros(shape)
        self.stale = np.zeros(n_seeds, bool)
        self.last = np.zeros(n_seeds, np.int64)
        self.rows = np.arange(n_seeds)

    def _quote(self, prior: Prior, ev: Evidence) -> RouteQuote:
        return route_quote(prior, ev, alpha=self.alpha, confidence=self.confidence)

    def _count(self, rows: I64, events: I64, sign: float) -> None:
        at = (rows, self.line[rows, events])
        v = self.value[rows, events]
        np.add.at(self.open_v, at, sign * v)
        np.add.at(self.open_v2, at, sign * v * v)

    def opened(self, k: int, holds: B) -> None:
        """Event k's hold is open where `holds`: admitted, or waiting for a human."""
        rows = self.rows[holds]
        self._count(rows, np.full(rows.size, k), 1.0)

    def closed(self, events: I64, mask: B) -> None:
        """The holds of `events` (one per seed, where `mask`) closed unsettled."""
        self._count(self.rows[mask], events[mask], -1.0)

    def observe(self, events: I64, posts: B) -> None:
        """Settled holds of `events` (one per seed, where `posts`) reveal their factors."""
        if not posts.any():
            return
        self.closed(events, posts)
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
                self.quotes[s][j] = self._quote(prior, ev)
        self.stale &= ~due
        self.last = np.where(due, t, self.last)
        line, face = self.line[:, k], self.face[:, k]
        pending = self.pending_at(line, self.value[:, k])
        factor = [self.quotes[s][line[s]].factor(pending[s]) for s in range(len(self.rows))]
        return np.ceil(face * (np.array(factor) * self.markup)).astype(np.int64)

    def pending_at(self, line: I64, value: F64) -> F64:
        """Holds pending on each seed's route once a hold of `value` joins them: a fixed
        number, or the effective number of the open ones and this one (at least 1, at
        most the policy's cap, as the gateway counts it)."""
        if self.pending is not None:
            return np.full(len(self.rows), self.pending)
        # the sums drift by float rounding as holds open and close: never below empty
        s1 = np.maximum(self.open_v[self.rows, line], 0.0) + value
        s2 = np.maximum(self.open_v2[self.rows, line], 0.0) + value * value
        return np.minimum(self.cap, np.maximum(1.0, s1 * s1 / np.where(s2 > 0, s2, 1.0)))
