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
"""

from __future__ import annotations


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
