"""The published gates and the naive shared-balance gates, as `Arm`s.

Money here is float USD, as in the published model. Each spec is a frozen value
object; `build(workload)` makes a fresh stateful arm for one run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim.humans import Humans
from sim.params import residual_quantile
from sim.runner import I64, B, Lagged, row_searchsorted, window_first
from sim.workload import BURST, Workload

F64 = npt.NDArray[np.float64]


def quantile_charge(wl: Workload, gamma: float, eps: float = 1.0, trust_agent: bool = True) -> F64:
    """The published charge c = eps * v * q_gamma(1 - r), per event, (S, K).

    Fragments carry the agent's declared residual factor when the gate trusts it.
    """
    lines = wl.model.lines
    q = np.array([residual_quantile(gamma, ln.recovery_a, ln.recovery_b) for ln in lines])
    factor = q[np.where(wl.frag, 0, wl.agent % len(lines))]
    declared = wl.attack.declared_factor if wl.attack is not None else None
    if trust_agent and declared is not None:
        factor = np.where(wl.frag, declared, factor)
    return np.asarray(eps * wl.value * factor)


def stress_charge(wl: Workload, calm: F64, gamma: float, eps: float = 1.0) -> F64:
    """The published perfect stress charging: an event of the burst is charged
    c = eps * v * q_gamma(1 - r) of the burst-time recovery Beta(corr_a, corr_b),
    every other event `calm`.

    "Perfect" means the gate reads the hidden burst label (`wl.phase`), which no real
    gate sees. A fragment whose declared factor the gate trusts keeps that factor, as
    a misdeclaration overrides the stress charge in the published model.
    """
    m = wl.model
    stressed = eps * wl.value * residual_quantile(gamma, m.corr_a, m.corr_b)
    declared = wl.attack is not None and wl.attack.declared_factor is not None
    burst = (wl.phase == BURST) & ~(wl.frag & declared)
    return np.asarray(np.where(burst, stressed, calm))


class _Admit:
    def decide(self, k: int, live: B) -> tuple[B, B]:
        return np.ones_like(live), np.zeros_like(live)

    def commit(self, k: int, executed: B) -> None:
        return None


@dataclass(frozen=True)
class Local:
    """Per-call gates only (value cap and rate limit, applied by the runner)."""

    def build(self, wl: Workload) -> _Admit:
        return _Admit()


class _Breaker:
    def __init__(self, wl: Workload, lag: int) -> None:
        self.wl, self.lag = wl, lag
        # visible: events of this window at ticks < t - lag, i.e. the window's realised
        # exposure observed `lag` late; a new window starts unhalted, as published
        obs = row_searchsorted(wl.tick, wl.tick - lag, "left")
        self.seen = Lagged(obs, window_first(wl))

    def decide(self, k: int, live: B) -> tuple[B, B]:
        watching = self.wl.tick[:, k] % self.wl.model.ticks - self.lag > 0
        halted = watching & (self.seen.seen(k) >= self.wl.model.tolerance)
        return ~halted, np.zeros_like(live)

    def commit(self, k: int, executed: B) -> None:
        self.seen.add(k, np.where(executed, self.wl.residual[:, k], 0.0))


@dataclass(frozen=True)
class Breaker:
    """Halt the fleet once realised exposure, observed `lag` ticks late, reaches R."""

    lag: int = 0

    def build(self, wl: Workload) -> _Breaker:
        return _Breaker(wl, self.lag)


class _Ledger:
    """Reserve `charge` against `limit` on one account per event; never refunded within
    a window, and every account starts empty in each new window (the published reset)."""

    def __init__(
        self,
        wl: Workload,
        charge: F64,
        account: I64,
        limit: float,
        n: int,
        humans: Humans | None = None,
    ) -> None:
        self.wl, self.charge, self.account, self.limit = wl, charge, account, limit
        self.reserved = np.zeros((charge.shape[0], n))
        self.rows = np.arange(charge.shape[0])
        self.window_of = wl.tick // wl.model.ticks
        self.window = np.zeros(charge.shape[0], np.int64)
        # published re-authorisation: a human approves a denied effect, whose charge is
        # then tracked apart from the ledger (never reserved)
        self.humans = humans
        self.late = np.zeros(wl.shape, bool)
        self.exec_tick = wl.tick.copy()
        self._approved = np.zeros(charge.shape[0], bool)

    def hear(self, k: int) -> None:
        """The humans' decisions of the last window, the renewal, then this window's
        decisions, by event k's tick. Called again, it does nothing."""
        t = self.wl.tick[:, k]
        window = self.window_of[:, k]
        renewed = window > self.window
        if self.humans is not None:
            self._hear(np.minimum(t, window * self.wl.model.ticks - 1))
        if renewed.any():
            self._renew(renewed)
            self.window = np.maximum(window, self.window)
            if self.humans is not None:
                self.humans.renew(renewed, self.window * self.wl.model.ticks)
        if self.humans is not None:
            self._hear(t)

    def _renew(self, renewed: B) -> None:
        self.reserved[renewed] = 0.0

    def decide(self, k: int, live: B) -> tuple[B, B]:
        t = self.wl.tick[:, k]
        self.hear(k)
        used = self.reserved[self.rows, self.account[:, k]]
        fits = used + self.charge[:, k] <= self.limit
        self._approved = np.zeros_like(live)
        if self.humans is None:
            return fits, np.zeros_like(live)
        denied = live & ~fits
        if self.humans.instant:
            self.humans.accrue(t)
            self._approved = self.humans.take(denied)
        else:
            self.humans.push(k, denied, t)
        return fits | self._approved, denied

    def commit(self, k: int, executed: B) -> None:
        reserve = executed & ~self._approved
        self.reserved[self.rows, self.account[:, k]] += np.where(reserve, self.charge[:, k], 0.0)

    def _hear(self, upto: I64) -> None:
        assert self.humans is not None
        for r in self.humans.resolve(upto):
            self.late[self.rows[r.approved], r.event[r.approved]] = True
            self.exec_tick[self.rows[r.approved], r.event[r.approved]] = r.when[r.approved]


@dataclass(frozen=True)
class Budget:
    """The published ledger: quantile charge against B = budget_frac * R, never refunded.

    With `stress`, the published E8 arm "budget + perfect stress charging"
    (`stress_charging` in the artifact's sim/fleetsim.py): events of the burst are
    charged the q_gamma residual of the burst-time recovery (0.947 of face for
    Beta(2, 6) at 0.95) instead of the calm one (0.521), the burst known perfectly
    from the workload's hidden label (`stress_charge`).
    """

    gamma: float = 0.95
    budget_frac: float = 1.0
    eps: float = 1.0
    approvals: int = 0  # published E6 re-authorisations per window; 0: none
    approval_latency: int = 0
    escalation_ttl: int | None = None  # None: = approval_latency (see sim/humans.py)
    fair_share: float | None = None  # published E9: an agent reserves at most this x B
    stress: bool = False  # published E8: the burst charged at its own quantile

    def build(self, wl: Workload) -> _Ledger:
        charge = quantile_charge(wl, self.gamma, self.eps)
        if self.stress:
            charge = stress_charge(wl, charge, self.gamma, self.eps)
        limit = self.budget_frac * wl.model.tolerance
        humans = None
        if self.approvals > 0:
            ttl = self.approval_latency if self.escalation_ttl is None else self.escalation_ttl
            n_seeds, n_events = wl.shape
            humans = Humans(
                n_seeds, n_events, self.approvals, wl.model.ticks, self.approval_latency, ttl
            )
        if self.fair_share is None:
            return _Ledger(wl, charge, np.zeros_like(wl.agent), limit, 1, humans)
        return _FairShare(wl, charge, limit, self.fair_share * limit, humans)


class _FairShare(_Ledger):
    """The tenant ledger plus a per-agent cap on reserved charge (published E9)."""

    def __init__(
        self, wl: Workload, charge: F64, limit: float, share: float, humans: Humans | None
    ) -> None:
        super().__init__(wl, charge, np.zeros_like(wl.agent), limit, 1, humans)
        self.share = share
        self.agent_reserved = np.zeros((charge.shape[0], wl.model.n_agents))

    def _renew(self, renewed: B) -> None:
        super()._renew(renewed)
        self.agent_reserved[renewed] = 0.0

    def decide(self, k: int, live: B) -> tuple[B, B]:
        self.hear(k)
        mine = self.agent_reserved[self.rows, self.wl.agent[:, k]]
        within = mine + self.charge[:, k] <= self.share
        admit, escalated = super().decide(k, live & within)
        return admit & within, escalated

    def commit(self, k: int, executed: B) -> None:
        reserve = executed & ~self._approved
        charge = np.where(reserve, self.charge[:, k], 0.0)
        self.agent_reserved[self.rows, self.wl.agent[:, k]] += charge
        super().commit(k, executed)


@dataclass(frozen=True)
class Cap:
    """Untyped aggregate spend cap: face value against R."""

    def build(self, wl: Workload) -> _Ledger:
        return _Ledger(wl, wl.value.copy(), np.zeros_like(wl.agent), wl.model.tolerance, 1)


@dataclass(frozen=True)
class Static:
    """Per-agent partitions of the budget: each agent may reserve mult * R / N."""

    mult: float = 1.0
    gamma: float = 0.95

    def build(self, wl: Workload) -> _Ledger:
        m = wl.model
        charge = quantile_charge(wl, self.gamma)
        return _Ledger(wl, charge, wl.agent, self.mult * m.tolerance / m.n_agents, m.n_agents)


class _Stale:
    """Check a balance as seen at an earlier event, then add to it (check-then-debit).

    The balance counts only the current window's events: it renews at each boundary."""

    def __init__(self, wl: Workload, obs: I64, charge: F64, strict: bool) -> None:
        self.wl, self.charge, self.strict = wl, charge, strict
        self.balance = Lagged(np.minimum(obs, np.arange(wl.shape[1])), window_first(wl))
        self.limit = wl.model.tolerance

    def decide(self, k: int, live: B) -> tuple[B, B]:
        seen = self.balance.seen(k)
        ok = seen + self.charge[:, k] <= self.limit if self.strict else seen < self.limit
        return ok, np.zeros_like(live)

    def commit(self, k: int, executed: B) -> None:
        self.balance.add(k, np.where(executed, self.charge[:, k], 0.0))


@dataclass(frozen=True)
class Toctou:
    """Check-then-debit of the published charge against a shared balance read at the
    start of the current `staleness`-tick window: concurrent checks race."""

    staleness: int = 10
    gamma: float = 0.95

    def build(self, wl: Workload) -> _Stale:
        start = wl.tick // self.staleness * self.staleness
        obs = row_searchsorted(wl.tick, start, "left")
        return _Stale(wl, obs, quantile_charge(wl, self.gamma), strict=True)


@dataclass(frozen=True)
class Posthoc:
    """Spend tracking: admit while recorded spend < R; an effect's realised residual is
    recorded `delay` ticks after it executes (debit after the effect)."""

    delay: int = 0

    def build(self, wl: Workload) -> _Stale:
        obs = row_searchsorted(wl.tick, wl.tick - self.delay, "right")
        return _Stale(wl, obs, wl.residual, strict=False)
