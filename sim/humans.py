"""The humans who approve escalations: a per-window capacity, a review latency, a TTL.

Approvals come from a token bucket, as the published re-authorisation (E6) has it:
`approvals` per window at an even pace, at most max(1, approvals / 10) banked, empty
at the start of each window. An escalation raised at tick t is first looked at at
t + `latency`; it is approved then if a token is there, or as soon as one accrues, and
expires unapproved at t + `ttl` (so ttl = latency: looked at once, refused if no
capacity; ttl < latency: never looked at in time). Escalations are served first come,
first served, so every seed's resolution times rise with its queue.

`Humans.resolve` is pure bookkeeping over (S,) arrays; the arms decide what an approval
or an expiry does to their ledgers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Resolved:
    """One step of resolutions: seeds `rows` resolved their queue slot `event`."""

    rows: B  # (S,) which seeds resolved an escalation in this step
    event: I64  # (S,) its event index (meaningful where rows)
    approved: B  # (S,) approved (else expired)
    when: I64  # (S,) tick of the approval or expiry


class Humans:
    def __init__(
        self, n_seeds: int, n_events: int, approvals: float, ticks: int, latency: int, ttl: int
    ) -> None:
        if latency < 0 or ttl < 0:
            raise ValueError(f"approval latency {latency} and ttl {ttl} must be >= 0 ticks")
        self.rate = approvals / ticks
        self.cap = max(1.0, approvals / 10)
        self.latency, self.ttl = latency, ttl
        self.tokens = np.zeros(n_seeds)
        self.last = np.zeros(n_seeds, np.int64)
        self.rows = np.arange(n_seeds)
        self.queue = np.zeros((n_seeds, n_events), np.int64)  # event index per slot
        self.raised = np.zeros((n_seeds, n_events), np.int64)  # tick raised per slot
        self.length = np.zeros(n_seeds, np.int64)
        self.head = np.zeros(n_seeds, np.int64)  # slots [0, head) are resolved
        # expiries not yet told to the runner, whose rate slots they give back
        self._expired: list[tuple[B, I64]] = []

    @property
    def instant(self) -> bool:
        """Looked at when raised and never waited on: the published E6 re-auth."""
        return self.latency == 0 and self.ttl == 0

    def accrue(self, t: I64) -> None:
        later = t > self.last
        grown = np.minimum(self.tokens + self.rate * (t - self.last), self.cap)
        self.tokens = np.where(later, grown, self.tokens)
        self.last = np.where(later, t, self.last)

    def take(self, wanted: B) -> B:
        """Instant approval: a token each for `wanted` seeds that have one."""
        got = wanted & (self.tokens >= 1.0)
        self.tokens -= got
        return got

    def renew(self, rolled: B, start: I64) -> None:
        self.tokens[rolled] = 0.0
        self.last[rolled] = start[rolled]

    def push(self, k: int, raised: B, t: I64) -> None:
        rows = self.rows[raised]
        slot = self.length[raised]
        self.queue[rows, slot] = k
        self.raised[rows, slot] = t[raised]
        self.length += raised

    def resolve(self, upto: I64) -> Iterator[Resolved]:
        """Resolve, queue order, every escalation decided by tick `upto` (per seed)."""
        while True:
            waiting = self.head < self.length
            if not waiting.any():
                return
            slot = np.minimum(self.head, self.queue.shape[1] - 1)
            raised = self.raised[self.rows, slot]
            look = np.maximum(raised + self.latency, self.last)
            at_look = np.minimum(self.tokens + self.rate * (look - self.last), self.cap)
            short = np.maximum(1.0 - at_look, 0.0)
            wait = np.ceil(short / self.rate) if self.rate > 0 else np.where(short > 0, math.inf, 0)
            approve_at = look + wait
            deadline = raised + self.ttl
            approved = approve_at <= deadline
            when = np.where(approved, approve_at, deadline).astype(np.int64)
            due = waiting & (when <= upto)
            if not due.any():
                return
            took = due & approved
            grown = np.minimum(self.tokens + self.rate * (when - self.last), self.cap)
            self.tokens = np.where(took, grown - 1.0, self.tokens)
            self.last = np.where(took, when, self.last)
            self.head += due
            event = self.queue[self.rows, slot]
            if (due & ~took).any():
                self._expired.append((due & ~took, event))
            yield Resolved(due, event, took, when)

    def expired(self) -> list[tuple[B, I64]]:
        """The escalations that expired unapproved since the last call: (seeds, event)
        pairs, one event per seed where its mask is set."""
        out, self._expired = self._expired, []
        return out
