"""Human approvals: capacity, latency, TTL, and the budget an escalation holds meanwhile."""

from __future__ import annotations

import numpy as np

from sim import metrics, runner, workload
from sim.arms import Budget
from sim.humans import Humans
from sim.irrev import Irrev
from sim.params import Attack, Model, Scenario
from sim.runner import B

TOL = 2.5


def _queue(approvals: float, latency: int, ttl: int, raised: list[int]) -> list[tuple[bool, int]]:
    h = Humans(1, len(raised), approvals, 1000, latency, ttl)
    for k, t in enumerate(raised):
        h.push(k, np.ones(1, bool), np.array([t]))
    out = []
    for r in h.resolve(np.array([10**6])):
        out.append((bool(r.approved[0]), int(r.when[0])))
    return out


def test_capacity_paces_approvals_and_the_ttl_expires_the_rest() -> None:
    # 10 approvals per 1000 ticks: a token every 100 ticks, at most one banked
    assert _queue(10, 5, 250, [0, 0, 0]) == [(True, 100), (True, 200), (False, 250)]


def test_latency_delays_even_a_ready_token() -> None:
    h = Humans(1, 1, 1000, 1000, 50, 50)
    h.accrue(np.array([10]))  # 10 tokens accrue, 100 may bank: capacity is not the limit
    h.push(0, np.ones(1, bool), np.array([10]))
    assert [(bool(r.approved[0]), int(r.when[0])) for r in h.resolve(np.array([59]))] == []
    assert [(bool(r.approved[0]), int(r.when[0])) for r in h.resolve(np.array([60]))] == [
        (True, 60)
    ]


def test_a_ttl_below_the_latency_approves_nothing() -> None:
    assert _queue(1000, 50, 10, [0, 5]) == [(False, 10), (False, 15)]


def test_published_reauthorisation_reproduces() -> None:
    """Published E6, H = 50: utility 0.327, post-burst 0.928 (seeds 6000-6299)."""
    wl = workload.build(Scenario(), range(6000, 6080))
    s = metrics.summarize(metrics.per_seed(wl, runner.run(Budget(approvals=50).build(wl), wl)))
    assert abs(s.utility - 0.32726) <= TOL * s.utility_ci, s
    assert abs(s.util_post - 0.928) < 0.05, s


def test_published_fair_share_reproduces() -> None:
    """Published E9: a 5% fair share lets the colluders move 199,500 USD, utility 0.117."""
    wl = workload.build(Scenario(attack=Attack()), range(9000, 9060))
    out = runner.run(Budget(fair_share=0.05).build(wl), wl)
    s = metrics.summarize(metrics.per_seed(wl, out))
    assert abs(s.moved - 199_500) < 0.02 * 199_500, s
    assert abs(s.utility - 0.11678) <= TOL * s.utility_ci, s


class _Held:
    """Records the tenant balance just before and after each commit of an irrev arm."""

    def __init__(self, spec: Irrev, wl: workload.Workload) -> None:
        self.arm = spec.build(wl)
        self.escalated: list[tuple[int, np.ndarray, np.ndarray]] = []

    @property
    def late(self) -> B:
        return self.arm.late

    @property
    def exec_tick(self) -> np.ndarray:
        return self.arm.exec_tick

    def decide(self, k: int, live: B) -> tuple[B, B]:
        admit, esc = self.arm.decide(k, live)
        self._esc = esc & ~admit
        return admit, esc

    def commit(self, k: int, executed: B) -> None:
        before = self.arm.balance[:, 0].copy()
        self.arm.commit(k, executed)
        self.escalated.append((k, self._esc, self.arm.balance[:, 0] - before))


def test_a_waiting_escalation_holds_its_budget_until_approved_or_expired() -> None:
    wl = workload.build(Scenario(), range(1000, 1030))
    held = _Held(Irrev(approval_latency=50, escalation_ttl=120), wl)
    out = runner.run(held, wl)
    arm = held.arm
    waited = np.zeros(wl.shape, bool)
    for k, esc, delta in held.escalated:
        np.testing.assert_array_equal(delta[esc], arm.price[esc, k])
        waited[:, k] = esc
    assert waited.any()
    late = out.executed & waited
    assert late.any() and (late == arm.late).all()
    delay = out.exec_tick - wl.tick
    assert (delay[late] >= 50).all() and (delay[late] <= 120).all()
    # an expired escalation gave its hold back: what the tenant has pending at the end
    # is the unsettled admitted holds, the unsettled approved ones and the undecided
    for s in range(wl.shape[0]):
        admitted = arm.held[s, int(arm.settled[s]) :].sum()
        approved = arm.approved_seq[s, int(arm.late_settled[s]) : int(arm.n_approved[s])]
        undecided = arm.humans.queue[s, int(arm.humans.head[s]) : int(arm.humans.length[s])]
        pending = admitted + arm.waiting[s, approved].sum() + arm.waiting[s, undecided].sum()
        assert arm.balance[s, 0] - arm.posted[s, 0] == pending


def test_latency_zero_keeps_instant_approvals() -> None:
    wl = workload.build(Scenario(Model(windows=2)), range(1000, 1020))
    a = runner.run(Irrev().build(wl), wl)
    b = runner.run(Irrev(approval_latency=0, escalation_ttl=0).build(wl), wl)
    np.testing.assert_array_equal(a.executed, b.executed)
    assert not a.executed[a.exec_tick != wl.tick].any()


def _over_rate(model: Model, spec: Irrev | Budget, seeds: range) -> tuple[int, int]:
    """Agent-windows whose executed effects exceed the rate limit, an effect counted
    in the window of its request (sim/runner.py's Rates), and how many escalations
    a human approved late."""
    wl = workload.build(Scenario(model), seeds)
    arm = spec.build(wl)
    out = runner.run(arm, wl)
    window = (wl.tick // model.ticks).clip(max=model.windows - 1)
    counts = np.zeros((len(seeds), model.windows, model.n_agents), np.int64)
    for s in range(len(seeds)):
        done = out.executed[s]
        np.add.at(counts[s], (window[s][done], wl.agent[s][done]), 1)
    late = int(np.asarray(arm.late).sum())
    return int((counts > model.rate_limit).sum()), late


def test_a_late_approval_counts_against_its_agents_rate() -> None:
    """The audit: approvals a human gave after a latency skipped the per-agent rate
    limit (126 of 5,000 agent-windows over a limit of 2). An escalation now takes its
    agent's rate slot when raised and keeps it if approved, for both gates with
    humans; many approvals arrive late here, so the limit is really exercised."""
    model = Model(rate_limit=2)
    for spec in (Irrev(approval_latency=10), Budget(approvals=50, approval_latency=10)):
        over, late = _over_rate(model, spec, range(1000, 1100))
        assert late > 100
        assert over == 0, spec


def test_an_expired_escalation_gives_its_rate_slot_back() -> None:
    """An escalation that expires unapproved was no purchase: at a limit of one, its
    agent still buys later in the window, which a slot kept for good would forbid."""
    model = Model(rate_limit=1)
    wl = workload.build(Scenario(model), range(1000, 1020))
    out = runner.run(Irrev(approval_latency=10, approvals=0).build(wl), wl)
    assert not (out.executed & out.escalated).any()  # no human: every one expired
    bought_after = 0
    for s, k in zip(*np.nonzero(out.escalated), strict=True):
        same = (wl.agent[s] == wl.agent[s, k]) & (wl.tick[s] // model.ticks == 0)
        bought_after += int((out.executed[s, k + 1 :] & same[k + 1 :]).any())
    assert bought_after > 0
