"""Irrev's arms: a hierarchical atomic ledger whose holds settle to realised residuals.

Accounts per seed, columns of (S, A) int64 arrays: 0 the tenant (limit R), 1..N the
agents, then one per supplier risk factor. Every purchase touches the tenant, its agent
and its supplier. Holds are priced at a high residual quantile (pricing/), settle
`settle_delay` ticks later to the realised residual, and posted amounts of a past
window roll off while pending holds carry over. `irrev-stressed` prices at face value
while its burst detector (by default the gateway's CUSUM) is on, and a calm-priced
hold keeps a blind-spot margin up to that price until the detector can vouch for it
(pricing/stress.py).

Decisions come from `ledger_model`, not Redis; `build(wl, tape)` records the ledger
operations of chosen seeds (`ledger_ops.Tape`), which tests/sim replays through the
Redis ledger to show both decide alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from sim import ledger_model as lm
from sim.calibrated import Calibrated, Pricing
from sim.humans import Humans
from sim.ledger_ops import ArmArrays, Tape
from sim.params import usd_to_micros
from sim.prices import cusum_signal, hold_prices, stress_signal
from sim.runner import I64, B
from sim.workload import Workload


@dataclass(frozen=True, kw_only=True)
class Irrev:
    """Arm `irrev` (calm-time prices) or, with `stressed`, `irrev-stressed`."""

    hold_quantile: float = 0.999
    settle_delay: int = 20
    soft_frac: float = 0.9
    approvals: int = 50  # escalations a human approves per window, at an even pace
    # ticks before a human looks at an escalation, whose hold keeps its budget while it
    # waits; it expires unapproved `escalation_ttl` ticks after it was raised (None:
    # = approval_latency, looked at once). 0 and None: approved or refused at once.
    approval_latency: int = 0
    escalation_ttl: int | None = None
    # self-calibrating prices (pricing/calibration.py): holds priced from the settled
    # evidence of their route; `pending` holds on a route at once (None: the holds
    # open on it when a hold is priced, sim/calibrated.py); `calibration`: the prior
    # (the catalog's recovery, worth `prior_weight` settlements), confidence, surcharge
    calibrate: bool = False
    calibration: Pricing = field(default_factory=Pricing)
    pending: float | None = None
    recalibrate_every: int = 10
    # the most holds an open-count price pools over (a policy's calibrate.pending, as
    # the gateway caps it; infinite: as many as are open)
    pending_cap: float = math.inf
    agent_limit_frac: float | None = 0.2
    supplier_limit_frac: float | None = None
    # the top account's limit as a fraction of R: below 1 where a policy's principal
    # caps the fleet under the tenant's tolerance
    top_limit_frac: float = 1.0
    # a route's calm loss factor as the gateway prices it (pricing's loss_factor of
    # the policy's route); None: the quantile of the product line at hold_quantile
    price_factor: float | None = None
    stressed: bool = False
    rho: float = 0.3
    stress_quantile: float = 0.999
    # least LGD factor while stressed: face value, because pricing's stressed LGD alone
    # (about 0.9) still overran often enough to overdraw 2% of seeds under E8
    stress_floor: float = 1.0
    signal_window: int = 5
    signal_mult: float = 4.0
    stress_hold: int = 50
    # stressed: a calm-priced hold must fit at its stressed price, and keeps the
    # difference held until the detector's window has passed over it without a trip
    # (pricing/stress.py); False: the detector's blind spot is priced calm
    blind_margin: bool = True
    # the detector (pricing/stress.py): `cusum`, the gateway's (a route's `stress`
    # block: the same cusum_step), Page's CUSUM for a shift of `cusum_shift` x a calm
    # rate it estimates itself, alarming at `cusum_h`, after a warm-up of
    # `calm_history` ticks of calm requests (one budget window); `rate`, a count over
    # `signal_window` ticks against the world's true calm rate
    detector: Literal["rate", "cusum"] = "cusum"
    cusum_shift: float = 2.0
    cusum_h: float = 4.0
    calm_history: int = 1000

    def build(self, wl: Workload, tape: Tape | None = None) -> _IrrevArm:
        """A fresh arm; with a `tape`, it also records its ledger operations."""
        return _IrrevArm(self, wl, tape)


def _limits(cfg: Irrev, wl: Workload, n_suppliers: int) -> I64:
    r = wl.model.tolerance

    def lim(frac: float | None) -> int:
        return lm.UNLIMITED if frac is None else usd_to_micros(frac * r)

    agents = [lim(cfg.agent_limit_frac)] * wl.model.n_agents
    top = usd_to_micros(cfg.top_limit_frac * r)
    return np.array([top, *agents, *[lim(cfg.supplier_limit_frac)] * n_suppliers])


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
        detect = cusum_signal if cfg.detector == "cusum" else stress_signal
        signal = detect(wl, cfg) if cfg.stressed else None
        self.stressed = signal.on if signal is not None else np.zeros(wl.shape, bool)
        # where a trip will count the event: read only once it is vouched for or not
        self.counted = signal.counted if signal is not None and cfg.blind_margin else None
        self.vouch_tick = signal.vouch_tick if signal is not None else None
        self.price = hold_prices(wl, cfg, self.stressed)
        if cfg.calibrate or self.counted is not None:
            self.hot = hold_prices(wl, cfg, np.ones(wl.shape, bool))
        self.cal: Calibrated | None = None
        if cfg.calibrate:
            self.cal = Calibrated(
                wl,
                cfg.hold_quantile,
                cfg.calibration,
                cfg.pending,
                cfg.recalibrate_every,
                cfg.pending_cap,
            )
        self.residual = np.ceil(wl.residual * 1e6).astype(np.int64)
        self.balance = np.zeros(self.limit.shape, np.int64)  # pending + posted
        self.posted = np.zeros(self.limit.shape, np.int64)
        self.held = np.zeros(wl.shape, np.int64)
        # the blind-spot margin each executed hold still keeps beside it, and the
        # margin of the event being decided
        self.margin = np.zeros(wl.shape, np.int64)
        self._margin = np.zeros(n_seeds, np.int64)
        self.vouched = np.zeros(n_seeds, np.int64)  # events [0, vouched) are past the window
        # admitted (or approved) holds: each one is posted, whatever its price
        self.admitted = np.zeros(wl.shape, bool)
        self.rows = np.arange(n_seeds)
        self.settled = np.zeros(n_seeds, np.int64)  # events [0, settled) are settled
        self.window = np.zeros(n_seeds, np.int64)
        ttl = cfg.approval_latency if cfg.escalation_ttl is None else cfg.escalation_ttl
        self.humans = Humans(
            n_seeds, wl.shape[1], cfg.approvals, wl.model.ticks, cfg.approval_latency, ttl
        )
        if tape is not None and not self.humans.instant:
            raise ValueError("a tape records instant approvals only: set approval_latency=0")
        # escalations waiting for a human: their hold, and where the approved ones stand
        self.waiting = np.zeros(wl.shape, np.int64)
        self.late = np.zeros(wl.shape, bool)  # executed when a human approved, later
        self.exec_tick = wl.tick.copy()
        self.approved_seq = np.zeros(wl.shape, np.int64)  # approved events, in order
        self.n_approved = np.zeros(n_seeds, np.int64)
        self.late_settled = np.zeros(n_seeds, np.int64)
        self._queued = np.zeros(n_seeds, bool)
        self.overruns = np.zeros(n_seeds, np.int64)
        self.tape = tape
        self._state = ArmArrays(self.balance, self.posted, self.accounts, self.price)
        self._decided: tuple[B, npt.NDArray[np.int8], B, B] | None = None

    def hear(self, k: int) -> None:
        """Everything that happens by event k's tick: the last window's human decisions
        and settlements, the roll, then this window's. Called again, it does nothing."""
        t = self.wl.tick[:, k]
        window_start = t // self.wl.model.ticks * self.wl.model.ticks
        self._advance(k, np.minimum(t, window_start - 1))
        self._roll(t // self.wl.model.ticks)
        self._advance(k, t)

    def decide(self, k: int, live: B) -> tuple[B, B]:
        t = self.wl.tick[:, k]
        self.hear(k)
        if self.cal is not None:
            learnt = self.cal.price(k, t)
            stressed = self.stressed[:, k]
            self.price[:, k] = np.where(stressed, np.maximum(self.hot[:, k], learnt), learnt)
        if self.counted is not None:
            # pricing.stress.stress_margin: what the hold would cost had the detector tripped
            gap = np.maximum(self.hot[:, k] - self.price[:, k], 0)
            self._margin = np.where(self.stressed[:, k], 0, gap)
        amount = self.price[:, k] + self._margin
        code = lm.decide(self.balance, self.limit, self.soft, self.accounts[:, k], amount)
        escalated = live & (code == lm.ESCALATE)
        if self.humans.instant:
            self.humans.accrue(t)
            approved = self.humans.take(escalated)
        else:
            approved = np.zeros_like(escalated)
            self.humans.push(k, escalated, t)
        self._queued = escalated if not self.humans.instant else np.zeros_like(escalated)
        if self.tape is not None:
            self._decided = (live, code, escalated, approved)
        return (code == lm.ADMIT) | approved, escalated

    def commit(self, k: int, executed: B) -> None:
        # a queued escalation's hold keeps its budget while the human has not decided
        self.waiting[:, k] = np.where(self._queued, self.price[:, k], 0)
        if self.cal is not None:
            self.cal.opened(k, executed | self._queued)
        lm.apply(self.balance, self.accounts[:, k], self.waiting[:, k])
        hold = np.where(executed, self.price[:, k], 0)
        self.held[:, k] = hold
        self.admitted[:, k] = executed
        self.margin[:, k] = np.where(executed, self._margin, 0)
        if self.tape is None or self._decided is None:
            lm.apply(self.balance, self.accounts[:, k], hold + self.margin[:, k])
            return
        # as the ledger sees it: the margin is a hold of its own, held whatever its own
        # decision (shadow), so the hold's reserve decides on top of it as `decide` did;
        # then the reserve admits (or escalates), the approval or rejection of an
        # escalation follows, and the margin of a hold not executed is voided
        live, code, escalated, approved = self._decided
        margined = live & (self._margin > 0)
        acc = self.accounts[:, k]
        shadow = lm.decide(self.balance, self.limit, self.soft, acc, self._margin)
        lm.apply(self.balance, acc, np.where(margined, self._margin, 0))
        self.tape.margin(k, margined, shadow, self._margin, self._state)
        admit_hold = np.where(code == lm.ADMIT, hold, 0)
        lm.apply(self.balance, acc, admit_hold)
        self.tape.reserve(k, live, code, self._state)
        lm.apply(self.balance, acc, hold - admit_hold)
        self.tape.resolve(k, escalated, approved, self._state)
        dropped = margined & ~executed
        lm.apply(self.balance, acc, -np.where(dropped, self._margin, 0))
        self.tape.release(np.full_like(self.rows, k), dropped, self._state)

    def _advance(self, k: int, upto: I64) -> None:
        """Everything that happens by tick `upto`: human decisions, then settlements."""
        for r in self.humans.resolve(upto):
            ev = np.where(r.rows, r.event, 0)
            acc = self.accounts[self.rows, ev]
            hold = self.waiting[self.rows, ev]
            expired = r.rows & ~r.approved
            lm.apply(self.balance, acc, np.where(expired, -hold, 0))
            if self.cal is not None:
                self.cal.closed(ev, expired)
            self.late[self.rows[r.approved], ev[r.approved]] = True
            self.exec_tick[self.rows[r.approved], ev[r.approved]] = r.when[r.approved]
            self.approved_seq[self.rows[r.approved], self.n_approved[r.approved]] = ev[r.approved]
            self.n_approved += r.approved
        self._vouch(k, upto)
        self._settle(k, upto)
        self._settle_late(upto)

    def _vouch(self, k: int, upto: I64) -> None:
        """Release the margin of every hold the detector's window has passed by tick
        `upto` (pricing.stress.vouched_at) without a trip counting it; a counted hold
        keeps its margin until it settles."""
        if self.counted is None:
            return
        assert self.vouch_tick is not None
        while True:
            i = np.minimum(self.vouched, max(k - 1, 0))
            due = (self.vouched < k) & (self.vouch_tick[self.rows, i] <= upto)
            if not due.any():
                return
            free = due & ~self.counted[self.rows, i]
            self._release(i, free)
            self.vouched += due

    def _release(self, events: I64, rows: B) -> None:
        """Release the margins still held by `events` (one per seed) where `rows`."""
        margin = np.where(rows, self.margin[self.rows, events], 0)
        if not margin.any():
            return
        lm.apply(self.balance, self.accounts[self.rows, events], -margin)
        self.margin[self.rows, events] -= margin
        if self.tape is not None:
            self.tape.release(events, margin > 0, self._state)

    def _settle_late(self, upto: I64) -> None:
        """Settle approved escalations, in approval order, `settle_delay` after approval."""
        while True:
            j = np.minimum(self.late_settled, self.approved_seq.shape[1] - 1)
            ev = self.approved_seq[self.rows, j]
            ready = self.exec_tick[self.rows, ev] + self.cfg.settle_delay <= upto
            due = (self.late_settled < self.n_approved) & ready
            if not due.any():
                return
            hold = np.where(due, self.waiting[self.rows, ev], 0)
            real = np.where(due, self.residual[self.rows, ev], 0)
            acc = self.accounts[self.rows, ev]
            lm.apply(self.balance, acc, real - hold)
            lm.apply(self.posted, acc, real)
            self.overruns += due & (real > hold)
            self.late_settled += due
            if self.cal is not None:
                self.cal.observe(ev, due)

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
            if self.cal is not None:
                self.cal.observe(i, posts)
            if self.tape is not None:
                self.tape.post(i, posts, real, self._state)
            # its residual is known and posted: a margin it still keeps has done its job
            self._release(i, due)

    def _roll(self, window: I64) -> None:
        rolled = window > self.window
        if rolled.any():
            self.balance[rolled] -= self.posted[rolled]
            self.posted[rolled] = 0
            self.window = np.maximum(window, self.window)
            # a human's approvals are a per-window capacity, as the published re-auth is
            self.humans.renew(rolled, self.window * self.wl.model.ticks)
            if self.tape is not None:
                self.tape.roll(self.window, rolled, self._state)
