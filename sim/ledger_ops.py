"""The ledger operations an irrev arm performs, recorded per seed so they can be replayed.

The irrev arms decide in-process (`ledger_model`) for speed; issue 5 requires that this
model decide exactly as the Redis ledger does on the same operations. A `Tape` records,
for a few seeds of a run, every operation in the order the arm made it, each with the
model's balances of the accounts it touched right after it. Replaying a tape through
`ledger.client.Ledger` and comparing is the equivalence test (tests/sim).

Operations map one to one onto ledger calls:
  Reserve  -> reserve (the model's decision: admit / escalate / deny)
  Resolve  -> approve or reject of the escalation just raised
  Post     -> post of an admitted hold at its realised residual (overruns included)
  Roll     -> window renewal: posted amounts roll off, pending holds carry over
  Margin   -> reserve, in shadow mode (held whatever its decision), of a calm-priced
              hold's blind-spot margin (pricing/stress.py), just before the hold's own
              reserve, which so decides on top of it
  Release  -> void of that margin: the hold was not executed, the stress detector
              vouched for it, or it settled
Account columns are those of sim/irrev.py: 0 the tenant, 1..N the agents, then one per
supplier risk factor; `account_ids` names them for the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ledger.limits import MAX_AMOUNT as LEDGER_MAX_AMOUNT
from sim import ledger_model as lm

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class AccountState:
    """One account column as the model holds it: pending and posted, micro-USD."""

    column: int
    pending: int
    posted: int


@dataclass(frozen=True, slots=True)
class Reserve:
    event: int  # event index k: also the hold's id
    accounts: tuple[int, ...]
    amount: int  # held on every account it touches
    decision: int  # ledger_model.ADMIT / ESCALATE / DENY
    # right after the decision; an escalation is not yet applied here (the model
    # resolves it in the same instant), so compare balances after its Resolve
    after: tuple[AccountState, ...]


@dataclass(frozen=True, slots=True)
class Resolve:
    event: int
    approved: bool
    after: tuple[AccountState, ...]


@dataclass(frozen=True, slots=True)
class Post:
    event: int
    amount: int  # realised residual; above the hold it is an overrun
    after: tuple[AccountState, ...]


@dataclass(frozen=True, slots=True)
class Margin:
    event: int  # the hold it stands beside
    accounts: tuple[int, ...]
    amount: int
    decision: int  # its own would-be decision; it is held whatever it is
    after: tuple[AccountState, ...]


@dataclass(frozen=True, slots=True)
class Release:
    event: int
    after: tuple[AccountState, ...]


@dataclass(frozen=True, slots=True)
class Roll:
    window: int  # the window that starts now
    after: tuple[AccountState, ...]  # every account


Op = Reserve | Resolve | Post | Roll | Margin | Release


@dataclass
class Tape:
    """Operations of the seeds at row indices `rows` of a workload, in arm order."""

    rows: tuple[int, ...]
    ops: dict[int, list[Op]] = field(init=False)

    def __post_init__(self) -> None:
        self.ops = {r: [] for r in self.rows}

    def reserve(self, k: int, live: B, code: npt.NDArray[np.int8], s: ArmArrays) -> None:
        for r in self._where(live):
            cols = s.columns(r, k)
            after = s.states(r, cols)
            self.ops[r].append(Reserve(k, cols, int(s.price[r, k]), int(code[r]), after))

    def resolve(self, k: int, escalated: B, approved: B, s: ArmArrays) -> None:
        for r in self._where(escalated):
            after = s.states(r, s.columns(r, k))
            self.ops[r].append(Resolve(k, bool(approved[r]), after))

    def post(self, events: I64, due: B, real: I64, s: ArmArrays) -> None:
        for r in self._where(due):
            i = int(events[r])
            self.ops[r].append(Post(i, int(real[r]), s.states(r, s.columns(r, i))))

    def margin(
        self, k: int, rows: B, code: npt.NDArray[np.int8], amount: I64, s: ArmArrays
    ) -> None:
        for r in self._where(rows):
            cols = s.columns(r, k)
            self.ops[r].append(Margin(k, cols, int(amount[r]), int(code[r]), s.states(r, cols)))

    def release(self, events: I64, rows: B, s: ArmArrays) -> None:
        for r in self._where(rows):
            i = int(events[r])
            self.ops[r].append(Release(i, s.states(r, s.columns(r, i))))

    def roll(self, window: I64, rolled: B, s: ArmArrays) -> None:
        for r in self._where(rolled):
            cols = tuple(range(s.balance.shape[1]))
            self.ops[r].append(Roll(int(window[r]), s.states(r, cols)))

    def _where(self, mask: B) -> list[int]:
        return [r for r in self.rows if mask[r]]


@dataclass(frozen=True)
class ArmArrays:
    """Views of an irrev arm's arrays that a Tape reads (all shared, never copied)."""

    balance: I64  # (S, A) pending + posted
    posted: I64  # (S, A)
    accounts: I64  # (S, K, 3)
    price: I64  # (S, K)

    def columns(self, r: int, k: int) -> tuple[int, ...]:
        return tuple(int(c) for c in self.accounts[r, k])

    def states(self, r: int, cols: Sequence[int]) -> tuple[AccountState, ...]:
        b, p = self.balance[r], self.posted[r]
        return tuple(AccountState(c, int(b[c] - p[c]), int(p[c])) for c in cols)


def account_ids(n_agents: int, n_suppliers: int) -> list[str]:
    """Ledger account ids (`kind:name`) of the model's columns, in column order."""
    agents = [f"agent:a{j}" for j in range(n_agents)]
    return ["tenant:all", *agents, *(f"factor:supplier{j}" for j in range(n_suppliers))]


def ledger_amount(limit: int) -> int:
    """A model limit as the ledger stores it: the ledger's amounts stop at 2^53 - 1 (exact
    in a Lua double), so the model's UNLIMITED becomes that, which no balance reaches."""
    return LEDGER_MAX_AMOUNT if limit >= lm.UNLIMITED else limit
