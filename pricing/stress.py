"""Stressed pricing driven by an observable request-rate detector, and the margin a
calm-priced hold carries until that detector can vouch for it.

The detector counts the requests of the last `window` ticks (or seconds) before the
one being priced and trips when the count reaches `trip_threshold`: `mult` times
the calm expectation, and at least 2. While it is on, holds are priced stressed
(`stressed_lgd`, at least face value for the simulator's irrev-stressed arm).

A rate detector is blind to the first requests of a burst: it trips only after
`trip_threshold` of them have arrived, and those were priced calm. When a shock also
worsens recovery, their residuals overrun calm prices: on 200 seeds of the published
correlated burst at N = 1000 every overdraw of irrev-stressed came from such holds
(docs/simulator.md). So a calm-priced hold is admitted only if it fits at its
stressed price, and the difference (`stress_margin`) stays held as a separate
margin until the detector's window has passed over the hold without a trip
(`vouched_at`): from then on no trip can count it, and it is calm by the detector's
own definition. If a trip counts it, its margin stays until the hold settles,
priced as if the detector had known. The margin's size and life come from the
detector's own parameters and the two prices; nothing in it is tuned.

A count over a short window misses a quiet burst: at 5x the calm rate for 600 ticks,
a fleet of 50 rarely sends the count's threshold within 5 ticks, and the burst's
holds were priced calm (8 and 15 overdraws per 1,000 seeds on two seed blocks).
Page's CUSUM for a Poisson rate sees both: a score that each request raises by
ln(shift) and that decays by (shift - 1) x the calm rate per tick drifts down in
calm and up at any rate above about (shift - 1) / ln(shift) x calm (2.2x for a shift
of 4), however slowly, and alarms when it reaches `h`; a loud burst reaches `h` in a
few requests. A request belongs to the run of the score it raised: if the score
decays to 0 first, that run is over and no alarm can count it (it is vouched for
from `cusum_run_end`); if the run alarms, its requests were the burst's first.
The calm rate is the detector's own estimate (`calm_rate`): the requests over the
ticks it saw while off, so a burst does not teach it that the burst is calm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar


class Quantity(Protocol):
    """A float, or one per seed: the simulator steps a detector per seed on numpy
    arrays, which pricing does not import (tests/pricing/test_purity.py)."""

    def __add__(self, other: Any, /) -> Any: ...
    def __radd__(self, other: Any, /) -> Any: ...
    def __sub__(self, other: Any, /) -> Any: ...
    def __gt__(self, other: Any, /) -> Any: ...
    def __ge__(self, other: Any, /) -> Any: ...
    def __lt__(self, other: Any, /) -> Any: ...
    def __le__(self, other: Any, /) -> Any: ...
    def __mul__(self, other: Any, /) -> Any: ...
    def __rmul__(self, other: Any, /) -> Any: ...
    def __truediv__(self, other: Any, /) -> Any: ...
    def __floordiv__(self, other: Any, /) -> Any: ...
    def __rsub__(self, other: Any, /) -> Any: ...
    def __neg__(self) -> Any: ...


Num = TypeVar("Num", bound=Quantity)


def trip_threshold(calm_per_tick: float, window: int, mult: float) -> float:
    """Requests in the last `window` ticks at which the detector trips: `mult` times
    the calm expectation, never below 2 (a small fleet's calm count is near 0)."""
    if window < 1 or mult <= 0 or calm_per_tick < 0:
        raise ValueError(
            f"detector window {window} must be >= 1, mult {mult} and calm rate "
            f"{calm_per_tick} positive: fix the stress detector's settings"
        )
    return max(2.0, mult * calm_per_tick * window)


def stress_margin(calm_price: int, stressed_price: int) -> int:
    """What a hold admitted at `calm_price` keeps held beside it until vouched for:
    what it would have cost had the detector already tripped (never negative)."""
    return max(0, stressed_price - calm_price)


def vouched_at(admitted_tick: int, window: int) -> int:
    """First tick at which no trip can count a hold admitted at `admitted_tick`: a
    trip at tick t counts the requests of ticks t - window .. t."""
    return admitted_tick + window + 1


def cusum_jump(shift: float) -> float:
    """What one request adds to the score: ln(shift), the log-likelihood ratio of an
    arrival at shift x the calm rate against one at the calm rate."""
    if shift <= 1:
        raise ValueError(f"CUSUM shift {shift} must be above 1: fix the stress detector's settings")
    return math.log(shift)


def cusum_decay(calm_per_tick: Num, shift: float) -> Num:
    """What the score loses per tick without a request: (shift - 1) x the calm rate.
    Arithmetic only, so a calm rate per seed (an array) gives a decay per seed."""
    return (shift - 1) * calm_per_tick


def calm_rate(requests: Num, ticks: Num) -> Num:
    """The detector's calm rate: the requests over the ticks it saw while off (its
    warm-up history included). Arithmetic only, as cusum_decay."""
    return requests / ticks


class Ops(Protocol):
    """The three element-wise operations a detector's step needs beyond arithmetic:
    `numpy` has them for a detector per seed; `SCALARS` for one detector (a gateway's)."""

    def where(self, cond: Any, a: Any, b: Any, /) -> Any: ...
    def maximum(self, a: Any, b: Any, /) -> Any: ...
    def ceil(self, a: Any, /) -> Any: ...


class _Scalars:
    def where(self, cond: Any, a: Any, b: Any, /) -> Any:
        return a if cond else b

    def maximum(self, a: Any, b: Any, /) -> Any:
        return max(a, b)

    def ceil(self, a: Any, /) -> Any:
        return float(math.ceil(a))


SCALARS: Ops = _Scalars()
# The least decay per tick: a calm rate estimated at 0 must not stop runs from ending.
MIN_DECAY = 1e-12
NEVER = -1e9  # the last alarm's tick when there has been none


def cusum_run_end(last_tick: Num, score: Num, decay: Num, ops: Ops = SCALARS) -> Num:
    """The first tick at which a score of `score` at `last_tick` has decayed to 0
    without another request: its run's requests are vouched for from then."""
    return last_tick + ops.ceil(score / decay)


@dataclass(frozen=True)
class Cusum:
    """A CUSUM detector's settings: the shift it looks for (x the calm rate), the score
    at which it alarms, and the ticks it stays on after an alarm."""

    shift: float
    h: float
    hold: int

    def __post_init__(self) -> None:
        cusum_jump(self.shift)
        if not self.h > 0 or self.hold < 0:
            raise ValueError(
                f"CUSUM threshold {self.h} must be above 0 and its hold {self.hold} at "
                "least 0 ticks: fix the stress detector's settings"
            )


@dataclass(frozen=True)
class CusumState(Generic[Num]):
    """What a CUSUM detector remembers between requests: a float each for a gateway's
    (kept in the tenant's ledger, ledger/lua/detector.lua), an array of one per seed
    for the simulator's. Ticks are whole numbers, kept as floats. `requests_off` and
    `ticks_off` are its calm history (a warm-up included); `run` numbers the runs."""

    score: Num
    last: Num
    last_alarm: Num
    requests_off: Num
    ticks_off: Num
    run: Num

    @classmethod
    def warmed(cls, requests: Num, ticks: Num, start: Num) -> CusumState[Num]:
        """A detector that has seen `requests` over `ticks` calm ticks before tick
        `start` (0, or 0 per seed, for the simulator; a gateway's first request's)."""
        zero = start * 0.0
        return cls(zero, start, zero + NEVER, requests + zero, ticks + zero, zero)

    @classmethod
    def stored(cls, fields: Mapping[str, float]) -> CusumState[float]:
        """A gateway's detector as detector.lua keeps it: fields s, l, a, r, t, n
        (`Ledger.stress_states` reads them)."""
        return CusumState(
            fields["s"], fields["l"], fields["a"], fields["r"], fields["t"], fields["n"]
        )

    @property
    def ever_alarmed(self) -> Any:
        return self.last_alarm > NEVER


@dataclass(frozen=True)
class CusumStep(Generic[Num]):
    """What one request did: `on`, it is priced stressed; `run`, the run it belongs to;
    `ended`, the run before it decayed to 0 first (vouched for from `ended_at`);
    `alarm`, its arrival alarmed, which counts the run before it."""

    on: Any
    run: Num
    ended: Any
    ended_at: Num
    alarm: Any


def cusum_step(
    state: CusumState[Num], tick: Num, valid: Any, cusum: Cusum, ops: Ops = SCALARS
) -> tuple[CusumState[Num], CusumStep[Num]]:
    """One request at `tick` (where `valid`: the simulator's padding is not one). The
    one transition of the detector: the simulator steps it per seed with numpy, a
    gateway's script (ledger/lua/detector.lua) line by line, and a test holds the two
    to the same answers on a recorded stream (tests/ledger/test_detector.py)."""
    s, t, w = state, tick, ops.where
    off = valid & (t - s.last_alarm > cusum.hold)
    ticks_off = s.ticks_off + w(off, t - s.last, 0.0)
    calm = calm_rate(s.requests_off, ops.maximum(ticks_off, 1.0))
    decay = ops.maximum(cusum_decay(calm, cusum.shift), MIN_DECAY)
    decayed = s.score - decay * (t - s.last)
    ended = valid & (s.score > 0) & (decayed <= 0)
    ended_at = cusum_run_end(s.last, s.score, decay, ops)
    run = s.run + w(ended, 1, 0)
    score = w(valid, ops.maximum(decayed, 0.0), s.score)
    alarm = valid & (score >= cusum.h)
    run_now = run + w(alarm, 1, 0)
    last_alarm = w(alarm, t, s.last_alarm)
    calm_now = t - last_alarm > cusum.hold
    state = CusumState(
        score=w(valid, w(alarm, 0.0, score) + cusum_jump(cusum.shift), s.score),
        last=w(valid, t, s.last),
        last_alarm=last_alarm,
        requests_off=s.requests_off + w(valid & calm_now, 1.0, 0.0),
        ticks_off=ticks_off,
        run=run_now,
    )
    on = t - last_alarm <= cusum.hold
    return state, CusumStep(on=on, run=run_now, ended=ended, ended_at=ended_at, alarm=alarm)


def cusum_at(state: CusumState[float], tick: float, cusum: Cusum) -> tuple[bool, float, float]:
    """A detector as it stands at `tick` with no request since its last: whether it is
    on, its score decayed to then, and its calm rate per tick (for an operator's view;
    `cusum_step` is what a request does)."""
    s = state
    off = tick - s.last_alarm > cusum.hold
    ticks_off = s.ticks_off + (tick - s.last if off else 0.0)
    calm = calm_rate(s.requests_off, max(ticks_off, 1.0))
    decay = max(cusum_decay(calm, cusum.shift), MIN_DECAY)
    return not off, max(0.0, s.score - decay * (tick - s.last)), calm


def margin_kept(
    state: CusumState[float], cusum: Cusum, tick: float, run: int, alarmed: bool
) -> bool:
    """Whether a hold priced while the detector was off, in run `run`, still keeps its
    stress margin at `tick`: for good if its run alarmed (its requests were a burst's
    first, priced before the detector could see it: the margin stays until the hold
    settles), and while its run is open (its score has not decayed to 0). A run that
    ended calm vouches for its requests: no alarm can count them any more."""
    if alarmed:
        return True
    if run < state.run:
        return False
    return cusum_at(state, tick, cusum)[1] > 0
