"""The irrev arms' in-process ledger model decides exactly as the Redis ledger does.

Issue 5 lets the irrev arms run on `sim.ledger_model` instead of Redis only if a test
proves that both make the same decisions on the same operation sequence (>= 10,000
operations). This is that test. The sequences are the ones the `irrev` and
`irrev-stressed` arms produce in real simulation runs (calm, correlated recovery,
misdeclared fragments, product lines with supplier limits, several budget windows),
recorded by a `Tape` for a few seeds of each. Each seed replays against its own
tenant of the real Redis ledger, one call per operation, and after every call the
ledger's decision and the pending and posted balance of every account the call
touched must equal the model's. One more sequence drives the model's functions with
small integer amounts, so that sums tie with the limits and `<=` is told from `<`.

Mapping of the model's operations onto the ledger:
- reserve: one hold per proposed event on its tenant, agent and supplier accounts,
  `escalate_above=0` and no approval thresholds (the model has none); TTLs far
  beyond the test, because the model never expires a hold (every hold settles).
- resolve: the model decides an escalation and its approval in the same instant, so
  approve or reject follows the reserve at once; the balance after the escalating
  reserve itself (held in the ledger, not yet in the model) is not compared.
- post: at the realised residual, overruns included.
- margin: irrev-stressed's blind-spot margin (pricing/stress.py) is a hold of its own,
  `m<event>`, reserved in shadow mode (held whatever its own decision, which must
  still match the model's) just before the hold's reserve; release voids it.
- window renewal: the ledger renews a window by Redis's TIME (`roll` in
  ledger/lua/_lib.lua: posted -> 0, pending carried over), which a test cannot move to
  a simulated tick. Accounts are therefore created without a window, and a renewal is
  replayed as a compensation of every hold posted in the ending window by all that it
  posted: the same change to pending and posted (posted -> 0, pending untouched) in
  one journaled operation per hold, at the moment the model renews.
- "unlimited" model accounts get the ledger's largest amount, 2^53 - 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

from ledger.client import Ledger
from ledger.records import AccountSpec, Reason, Status, Verdict
from sim import ledger_model as lm
from sim import runner, workload
from sim.irrev import Irrev
from sim.ledger_ops import (
    ArmArrays,
    Margin,
    Op,
    Post,
    Release,
    Reserve,
    Resolve,
    Roll,
    Tape,
    account_ids,
    ledger_amount,
)
from sim.params import Attack, Model, ProductLine, Scenario, Spike

# Slow (about a minute a server): .ci/run runs it, README's test command does not.
pytestmark = pytest.mark.slow

DAY_MS = 24 * 3600 * 1000
DECISIONS = {lm.ADMIT: Verdict.ADMIT, lm.ESCALATE: Verdict.ESCALATE, lm.DENY: Verdict.DENY}
MIN_OPERATIONS = 10_000

_LINES = (
    ProductLine(),
    ProductLine(value_mu=10.2, value_sigma=0.4, recovery_a=4.0, recovery_b=2.0, supplier=1),
    ProductLine(value_mu=9.0, value_sigma=0.6, recovery_a=9.0, recovery_b=1.5, supplier=2),
)


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    arm: Irrev
    seeds: range


CASES = {
    # three windows, and a settlement delay long enough that holds carry over renewals
    "calm-3-windows": Case(Scenario(Model(windows=3)), Irrev(settle_delay=200), range(1000, 1008)),
    # realised residuals above the hold: overruns, then over_limit denials
    "correlated": Case(Scenario(Model(correlated=True, windows=2)), Irrev(), range(8000, 8008)),
    "correlated-stressed": Case(
        Scenario(Model(correlated=True, windows=2)), Irrev(stressed=True), range(8000, 8004)
    ),
    # a flood of fragments: mostly denials and rejected escalations
    "misdeclared-fragments": Case(
        Scenario(attack=Attack(declared_factor=0.226)), Irrev(stressed=True), range(1000, 1004)
    ),
    # three product lines and suppliers, each supplier account with its own limit
    "spike-supplier-limits": Case(
        Scenario(Model(lines=_LINES, spike=Spike(), windows=2)),
        Irrev(stressed=True, supplier_limit_frac=0.5),
        range(1000, 1004),
    ),
}


@dataclass(frozen=True)
class Recorded:
    """One seed's operations, and the account policy the model ran with."""

    ops: list[Op]
    names: list[str]
    limits: list[int]
    softs: list[int]


@functools.cache
def recorded(case_id: str) -> tuple[Recorded, ...]:
    """Run the case's arm over its seeds once, recording every seed's operations."""
    if case_id == LATTICE:
        return tuple(lattice(np.random.default_rng([LATTICE_SEED, i])) for i in range(4))
    case = CASES[case_id]
    wl = workload.build(case.scenario, case.seeds)
    tape = Tape(tuple(range(len(case.seeds))))
    arm = case.arm.build(wl, tape)
    runner.run(arm, wl)
    names = account_ids(wl.model.n_agents, arm.limit.shape[1] - 1 - wl.model.n_agents)
    limits = [int(x) for x in arm.limit[0]]
    softs = [int(x) for x in arm.soft[0]]
    return tuple(Recorded(tape.ops[r], names, limits, softs) for r in tape.rows)


# Real runs' amounts almost never sum exactly to a limit, so they cannot tell `<=` from
# `<`. This sequence drives the model's own functions with amounts on a coarse integer
# lattice, in the arm's order of calls, so that ties with soft and hard limits are common.
LATTICE = "lattice-ties"
LATTICE_SEED = 5_000
_LATTICE_LIMITS = np.array([[60, 24, 24, 30]], np.int64)  # tenant, two agents, a supplier
_LATTICE_SOFT = np.array([[40, 16, 24, 30]], np.int64)  # two without a soft band


def lattice(rng: np.random.Generator, n_events: int = 450) -> Recorded:
    balance, posted = np.zeros((2, 1, 4), np.int64)
    agents = rng.integers(1, 3, n_events)
    accounts = np.stack([np.zeros_like(agents), agents, np.full_like(agents, 3)], 1)[None]
    price = rng.integers(0, 9, (1, n_events))
    arrays = ArmArrays(balance, posted, accounts, price)
    tape, one = Tape((0,)), np.ones(1, bool)
    held: list[int] = []
    for k in range(n_events):
        while held and rng.random() < 0.7:  # settle, oldest first; one in ten overruns
            i = held.pop(0)
            real = rng.integers(0, price[0, i] + 1 + 4 * (rng.random() < 0.1), 1)
            lm.apply(balance, accounts[:, i], real - price[:, i])
            lm.apply(posted, accounts[:, i], real)
            tape.post(np.array([i]), one, real, arrays)
        if rng.random() < 0.05:  # window renewal
            balance -= posted
            posted[:] = 0
            tape.roll(np.array([k]), one, arrays)
        code = lm.decide(balance, _LATTICE_LIMITS, _LATTICE_SOFT, accounts[:, k], price[:, k])
        approved = (code == lm.ESCALATE) & (rng.random(1) < 0.5)
        if code[0] == lm.ADMIT:
            lm.apply(balance, accounts[:, k], price[:, k])
        tape.reserve(k, one, code, arrays)
        if approved[0]:
            lm.apply(balance, accounts[:, k], price[:, k])
        tape.resolve(k, code == lm.ESCALATE, approved, arrays)
        if code[0] == lm.ADMIT or approved[0]:
            held.append(k)
    limits, softs = _LATTICE_LIMITS[0].tolist(), _LATTICE_SOFT[0].tolist()
    return Recorded(tape.ops[0], account_ids(2, 1), limits, softs)


def test_sequences_are_long_and_cover_every_path() -> None:
    runs = [seed.ops for case_id in CASES for seed in recorded(case_id)]
    assert sum(map(len, runs)) >= MIN_OPERATIONS  # from the arms' own runs alone
    ops = [op for seed_ops in runs for op in seed_ops]
    decisions = {op.decision for op in ops if isinstance(op, Reserve)}
    assert decisions == set(DECISIONS)
    assert {op.approved for op in ops if isinstance(op, Resolve)} == {True, False}
    # a renewal with holds still pending, which must carry over
    assert any(isinstance(op, Roll) and any(a.pending for a in op.after) for op in ops)
    assert any(_overruns(seed_ops) for seed_ops in runs)
    # irrev-stressed's blind-spot margins: held in shadow mode, then voided
    assert any(isinstance(op, Margin) for op in ops)
    assert any(isinstance(op, Release) for op in ops)


def _overruns(ops: list[Op]) -> int:
    held = {op.event: op.amount for op in ops if isinstance(op, Reserve)}
    return sum(isinstance(op, Post) and op.amount > held[op.event] for op in ops)


@pytest.mark.parametrize("case_id", [*CASES, LATTICE])
async def test_model_and_redis_ledger_agree(redis_url: str, tenant: str, case_id: str) -> None:
    ledger = Ledger.from_url(redis_url)
    try:
        await ledger.load_scripts()
        for i, seed in enumerate(recorded(case_id)):
            await _replay(ledger, f"{tenant}.{i}", seed)
    finally:
        await ledger.aclose()


async def _replay(ledger: Ledger, tenant: str, seed: Recorded) -> None:
    for name, limit, soft in zip(seed.names, seed.limits, seed.softs, strict=True):
        await ledger.upsert_account(
            tenant,
            AccountSpec(account=name, limit=ledger_amount(limit), soft_limit=ledger_amount(soft)),
        )
    posted_in_window: dict[str, int] = {}
    for step, op in enumerate(seed.ops):
        where = f"{tenant} op {step} {op}"
        if isinstance(op, Reserve):
            amounts = {seed.names[c]: op.amount for c in op.accounts}
            got = await ledger.reserve(
                tenant, _hold(op.event), "sim", amounts, ttl_ms=DAY_MS, escalation_ttl_ms=DAY_MS
            )
            assert got.status is Status.OK, where
            assert got.decision is DECISIONS[op.decision], where
            if got.decision is Verdict.ESCALATE:
                assert got.reason is Reason.SOFT_BAND, where
                continue  # held by the ledger until the Resolve that follows
        elif isinstance(op, Resolve):
            if op.approved:
                await ledger.approve(tenant, _hold(op.event), "sim", ttl_ms=DAY_MS)
            else:
                await ledger.reject(tenant, _hold(op.event), "sim")
        elif isinstance(op, Post):
            await ledger.post(tenant, _hold(op.event), op.amount)
            posted_in_window[_hold(op.event)] = op.amount
        elif isinstance(op, Margin):
            amounts = {seed.names[c]: op.amount for c in op.accounts}
            got = await ledger.reserve(
                tenant,
                _margin(op.event),
                "sim",
                amounts,
                ttl_ms=DAY_MS,
                escalation_ttl_ms=DAY_MS,
                shadow=True,
            )
            assert got.status is Status.OK, where
            assert got.decision is DECISIONS[op.decision], where
        elif isinstance(op, Release):
            released = await ledger.void(tenant, _margin(op.event))
            assert released.status is Status.OK, where
        else:
            for hold, amount in posted_in_window.items():
                if amount:
                    await ledger.compensate(tenant, hold, amount)
            posted_in_window.clear()
        for expected in op.after:
            got_balance = await ledger.balance(tenant, seed.names[expected.column])
            assert got_balance is not None, where
            assert (got_balance.pending, got_balance.posted) == (
                expected.pending,
                expected.posted,
            ), f"{where}: {seed.names[expected.column]}"
    # and nothing the per-call checks did not look at drifted
    final = {b.account: (b.pending, b.posted) for b in await ledger.balances(tenant)}
    assert final == _final_state(seed), tenant


def _final_state(seed: Recorded) -> dict[str, tuple[int, int]]:
    state = {name: (0, 0) for name in seed.names}
    for op in seed.ops:
        for a in op.after:
            state[seed.names[a.column]] = (a.pending, a.posted)
    return state


def _hold(event: int) -> str:
    return f"h{event}"


def _margin(event: int) -> str:
    return f"m{event}"


def test_unlimited_accounts_fit_the_ledger() -> None:
    assert ledger_amount(lm.UNLIMITED) == 2**53 - 1
    assert ledger_amount(int(np.int64(12345))) == 12345


def test_recording_does_not_change_the_run() -> None:
    """The taped commit path applies holds in two steps; the outcome must be the same."""
    case = CASES["correlated-stressed"]
    wl = workload.build(case.scenario, case.seeds)
    plain, taped = case.arm.build(wl), case.arm.build(wl, Tape((0, 2)))
    a, b = runner.run(plain, wl), runner.run(taped, wl)
    for field in ("gated", "executed", "escalated", "overruns"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_array_equal(plain.balance, taped.balance)
