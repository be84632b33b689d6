"""Irrev's arms: a hierarchical atomic ledger whose holds settle to realised residuals.

Accounts per seed, columns of (S, A) int64 arrays: 0 the tenant (limit R), 1..N the
agents, then one per supplier risk factor. Every purchase touches the tenant, its agent
and its supplier. Holds are priced at a high residual quantile (pricing/), settle
`settle_delay` ticks later to the realised residual, and posted amounts of a past
window roll off while pending holds carry over.

Decisions come from `ledger_model`, not Redis; `build(wl, tape)` records the ledger
operations of chosen seeds (`ledger_ops.Tape`), which tests/sim replays through the
Redis ledger to show both decide alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim import ledger_model as lm
from sim.ledger_ops import ArmArrays, Tape
from sim.params import usd_to_micros
from sim.prices import hold_prices, stress_signal
from sim.runner import I64, B
from sim.workload import Workload


@dataclass(frozen=True, kw_only=True)
class Irrev:
    """Arm `irrev` (calm-time prices) or, with `stressed`, `irrev-stressed`."""

    hold_quantile: float = 0.999
    settle_delay: int = 20
    soft_frac: float = 0.9
    approvals: int = 50  # escalations a human approves per window, at an even pace
    agent_limit_frac: float | None = 0.2
    supplier_limit_frac: float | None = None
    stressed: bool = False
    rho: float = 0.3
    stress_quantile: float = 0.999
    # least LGD factor while stressed: face value, because pricing's stressed LGD alone
    # (about 0.9) still overran often enough to overdraw 2% of seeds under E8
    stress_floor: float = 1.0
    signal_window: int = 5
    signal_mult: float = 4.0
    stress_hold: int = 50

    def build(self, wl: Workload, tape: Tape | None = None) -> _IrrevArm:
        """A fresh arm; with a `tape`, it also records its ledger operations."""
        return _IrrevArm(self, wl, tape)


def _limits(cfg: Irrev, wl: Workload, n_suppliers: int) -> I64:
    r = wl.model.tolerance

    def lim(frac: float | None) -> int:
        return lm.UNLIMITED if frac is None else usd_to_micros(frac * r)

    agents = [lim(cfg.agent_limit_frac)] * wl.model.n_agents
    return np.array([usd_to_micros(r), *agents, *[lim(cfg.supplier_limit_frac)] * n_suppliers])


class _IrrevArm:
    def __init__(self, cfg: Irrev, wl: Workload, tape: Tape | None = None) -> None:
        self.cfg, self.wl = cfg, wl
        n_seeds, _ = wl.shape
        n_sup = int(wl.supplier.max()) + 1
        limit = _limits(cfg, wl, n_sup)
        self.limit = np.broadcast_to(limit, (n_seeds, limit.size))
        self.soft = np.broadcast_to(lm.soft_band(limit, cfg.soft_frac), self.limit.shape)
        n = wl.model.n_agents
        # (S, K, 3): tenant, agent, supplier account of each event
        self.accounts = np.stack([np.zeros_like(wl.agent), 1 + wl.agent, 1 + n + wl.supplier], 2)
        stressed = stress_signal(wl, cfg) if cfg.stressed else np.zeros(wl.shape, bool)
        self.price = hold_prices(wl, cfg, stressed)
        self.residual = np.ceil(wl.residual * 1e6).astype(np.int64)
        self.balance = np.zeros(self.limit.shape, np.int64)  # pending + posted
        self.posted = np.zeros(self.limit.shape, np.int64)
        self.held = np.zeros(wl.shape, np.int64)
        # admitted (or approved) holds: each one is posted, whatever its price
        self.admitted = np.zeros(wl.shape, bool)
        self.rows = np.arange(n_seeds)
        self.settled = np.zeros(n_seeds, np.int64)  # events [0, settled) are settled
        self.window = np.zeros(n_seeds, np.int64)
        self.tokens = np.zeros(n_seeds)
        self.last_tick = np.zeros(n_seeds, np.int64)
        self.overruns = np.zeros(n_seeds, np.int64)
        self.tape = tape
        self._state = ArmArrays(self.balance, self.posted, self.accounts, self.price)
        self._decided: tuple[B, npt.NDArray[np.int8], B, B] | None = None

    def decide(self, k: int, live: B) -> tuple[B, B]:
        t = self.wl.tick[:, k]
        window_start = t // self.wl.model.ticks * self.wl.model.ticks
        self._settle(k, np.minimum(t, window_start - 1))
        self._roll(t // self.wl.model.ticks)
        self._settle(k, t)
        self._accrue(t)
        code = lm.decide(self.balance, self.limit, self.soft, self.accounts[:, k], self.price[:, k])
        escalated = live & (code == lm.ESCALATE)
        approved = escalated & (self.tokens >= 1.0)
        self.tokens -= approved
        if self.tape is not None:
            self._decided = (live, code, escalated, approved)
        return (code == lm.ADMIT) | approved, escalated

    def commit(self, k: int, executed: B) -> None:
        hold = np.where(executed, self.price[:, k], 0)
        self.held[:, k] = hold
        self.admitted[:, k] = executed
        if self.tape is None or self._decided is None:
            lm.apply(self.balance, self.accounts[:, k], hold)
            return
        # as the ledger sees it: the reserve admits (or escalates), then the approval
        # or rejection of an escalation follows; the model applies only approved ones
        live, code, escalated, approved = self._decided
        admit_hold = np.where(code == lm.ADMIT, hold, 0)
        lm.apply(self.balance, self.accounts[:, k], admit_hold)
        self.tape.reserve(k, live, code, self._state)
        lm.apply(self.balance, self.accounts[:, k], hold - admit_hold)
        self.tape.resolve(k, escalated, approved, self._state)

    def _settle(self, k: int, upto: I64) -> None:
        """Settle, in admission order, every hold whose residual is known by tick `upto`."""
        delay = self.cfg.settle_delay
        while True:
            i = np.minimum(self.settled, max(k - 1, 0))
            due = (self.settled < k) & (self.wl.tick[self.rows, i] + delay <= upto)
            if not due.any():
                return
            hold = np.where(due, self.held[self.rows, i], 0)
            # every admitted hold posts its residual, as the ledger's post does; keying
            # this on hold > 0 would drop the residual of a hold priced at zero
            posts = due & self.admitted[self.rows, i]
            real = np.where(posts, self.residual[self.rows, i], 0)
            acc = self.accounts[self.rows, i]
            lm.apply(self.balance, acc, real - hold)
            lm.apply(self.posted, acc, real)
            self.overruns += real > hold
            self.settled += due
            if self.tape is not None:
                self.tape.post(i, posts, real, self._state)

    def _roll(self, window: I64) -> None:
        rolled = window > self.window
        if rolled.any():
            self.balance[rolled] -= self.posted[rolled]
            self.posted[rolled] = 0
            self.window = np.maximum(window, self.window)
            # a human's approvals are a per-window capacity, as the published re-auth is
            self.tokens[rolled] = 0.0
            self.last_tick[rolled] = self.window[rolled] * self.wl.model.ticks
            if self.tape is not None:
                self.tape.roll(self.window, rolled, self._state)

    def _accrue(self, t: I64) -> None:
        h = self.cfg.approvals
        rate = h / self.wl.model.ticks
        self.tokens = np.minimum(self.tokens + rate * (t - self.last_tick), max(1.0, h / 10))
        self.last_tick = t.copy()  # t is a view of the workload, which _roll must not write
