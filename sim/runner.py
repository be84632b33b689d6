"""The event loop every arm shares: per-call gate, arm decision, execution.

The loop walks the event axis of a (S, K) workload once and decides all S seeds of
event k at once, so its Python overhead is O(K), not O(S * K). Arms are stateful
objects that see one event column at a time and may look back at earlier columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from sim.workload import Workload

B = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]
Side = Literal["left", "right"]


class Arm(Protocol):
    """An admission gate; `decide` returns (admit, escalated) masks of shape (S,).

    An arm with humans who decide later has `humans` (sim/humans.py) and `hear(k)`,
    which applies everything decided by event k's tick, so the runner's rate gate sees
    the slots that expired escalations gave back before it gates event k."""

    def decide(self, k: int, live: B) -> tuple[B, B]: ...

    def commit(self, k: int, executed: B) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """What happened to every event, all (S, K) bool, plus per-seed `overruns` (S,)."""

    gated: B  # passed the per-call gate (value cap, rate limit): a real proposal
    executed: B  # at once or, approved by a human, later
    escalated: B
    overruns: I64
    exec_tick: I64  # when each executed event ran: its tick, or its approval's


def row_searchsorted(rows: I64, queries: I64, side: Side = "left") -> I64:
    """np.searchsorted of queries[s] in sorted rows[s], for every row s at once."""
    lo = min(int(rows.min(initial=0)), int(queries.min(initial=0)))
    width = max(int(rows.max(initial=0)), int(queries.max(initial=0))) - lo + 2
    shift = np.arange(rows.shape[0])[:, None] * width - lo
    flat = np.searchsorted((rows + shift).ravel(), (queries + shift).ravel(), side=side)
    return np.asarray(
        flat.reshape(queries.shape) - np.arange(rows.shape[0])[:, None] * rows.shape[1]
    )


def window_first(wl: Workload) -> I64:
    """(S, K): index of the first event of the budget window that event k falls in."""
    start = wl.tick // wl.model.ticks * wl.model.ticks
    return row_searchsorted(wl.tick, start, "left")


class Lagged:
    """A running per-seed sum over executed events, read as of an earlier event index.

    `obs[s, k]` is how many of seed s's first events are visible when event k is
    decided; it must be <= k, so every visible value is already known. With `since`,
    the sum starts at event `since[s, k]` (the first event of k's budget window), so
    a balance renews at each window boundary as the published ledger's does.
    """

    def __init__(self, obs: I64, since: I64 | None = None) -> None:
        self.since = np.zeros_like(obs) if since is None else since
        self.obs = np.maximum(obs, self.since)
        self.cum = np.zeros((obs.shape[0], obs.shape[1] + 1))
        self.rows = np.arange(obs.shape[0])

    def seen(self, k: int) -> npt.NDArray[np.float64]:
        return self.cum[self.rows, self.obs[:, k]] - self.cum[self.rows, self.since[:, k]]

    def add(self, k: int, amount: npt.NDArray[np.float64]) -> None:
        self.cum[:, k + 1] = self.cum[:, k] + amount


class Rates:
    """The per-call gate's rate limit: purchases per agent per window, renewed at each
    window. An effect counts in the window of its request, when it is admitted or,
    escalated, sent to a human who decides later: the gateway's reserve steps the
    agent's effect rate at the request, whatever its decision, and the approval steps
    no rate (ledger/lua/reserve.lua, approve.lua). So an escalation holds its agent's
    slot while it waits, and an approval executes on the slot its request took, in
    whatever window the human approves it; one that expires unapproved gives its slot
    back, as a refused purchase does not count in the published model."""

    def __init__(self, wl: Workload) -> None:
        m = wl.model
        self.limit = m.rate_limit
        self.used = np.zeros((wl.shape[0], m.windows * m.n_agents), np.int64)
        self.slot = (wl.tick // m.ticks).clip(max=m.windows - 1) * m.n_agents + wl.agent
        self.rows = np.arange(wl.shape[0])

    def room(self, k: int) -> B:
        return np.asarray(self.used[self.rows, self.slot[:, k]] < self.limit)

    def take(self, k: int, rows: B) -> None:
        self.used[self.rows, self.slot[:, k]] += rows

    def give_back(self, events: I64, rows: B) -> None:
        self.used[self.rows, self.slot[self.rows, events]] -= rows


def _give_back(arm: Arm, rates: Rates) -> None:
    """Return the rate slots of the escalations the arm's humans let expire."""
    humans = getattr(arm, "humans", None)
    if humans is not None:
        for rows, events in humans.expired():
            rates.give_back(events, rows)


def run(arm: Arm, wl: Workload) -> Outcome:
    model, attack = wl.model, wl.attack
    n_seeds, n_events = wl.shape
    rates = Rates(wl)
    # arms whose humans decide later: escalations they queue take a rate slot
    humans = getattr(arm, "humans", None)
    queues = humans is not None and not humans.instant
    hear = getattr(arm, "hear", None)
    moved = np.zeros(n_seeds)
    gated = np.zeros(wl.shape, bool)
    executed = np.zeros(wl.shape, bool)
    escalated = np.zeros(wl.shape, bool)
    for k in range(n_events):
        live = wl.valid[:, k].copy()
        if attack is not None:
            live &= ~wl.frag[:, k] | (moved + attack.piece <= attack.total)
        if hear is not None:
            hear(k)  # what the humans decided by this tick frees or keeps rate slots
        _give_back(arm, rates)
        passes = live & (wl.value[:, k] <= model.value_cap) & rates.room(k)
        admit, esc = arm.decide(k, passes)
        ex = passes & admit
        waits = passes & esc & ~admit if queues else np.zeros_like(ex)
        rates.take(k, ex | waits)
        moved += np.where(ex & wl.frag[:, k], wl.value[:, k], 0.0)
        arm.commit(k, ex)
        gated[:, k], executed[:, k], escalated[:, k] = passes, ex, esc & passes
    overruns = getattr(arm, "overruns", np.zeros(n_seeds, np.int64))
    # escalations a human approved after a latency ran late (arms with a review queue)
    executed |= getattr(arm, "late", False)
    exec_tick = getattr(arm, "exec_tick", wl.tick)
    return Outcome(gated, executed, escalated, overruns, exec_tick)
