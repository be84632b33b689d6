"""Per-seed outcomes and their summaries over seeds (Wilson and normal 95% intervals)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim.runner import Outcome
from sim.workload import BURST, POST, PRE, Workload

F64 = npt.NDArray[np.float64]
Z95 = 1.959963984540054
# percent levels of the per-seed worst-window quantiles every row carries: the
# figure's per-seed panel is drawn from them, so the JSON holds what the figure shows
# and a row stays nine floats however many seeds ran
EXPOSURE_Q = (0, 1, 5, 25, 50, 75, 95, 99, 100)
# The worst-window quantile the Pareto verdict compares (issue 28 item 5): a sample
# maximum turns on one seed (a grid point flipped between two seed blocks on it).
WORST_Q = 0.99
WORST_FIELDS = ("worst_q99", "worst_q99_lo", "worst_q99_hi")


def quantile_ci(values: F64, q: float, z: float = Z95) -> tuple[float, float, float]:
    """The q-quantile of `values` and a distribution-free 95% interval for it: the
    order statistics whose ranks are n q less and more z binomial standard deviations
    (n q (1 - q))^0.5, clipped to the sample."""
    ordered = np.sort(values)
    n = ordered.size
    centre, half = n * q, z * math.sqrt(n * q * (1 - q))
    lo = max(0, math.floor(centre - half) - 1)
    hi = min(n - 1, math.ceil(centre + half) - 1)
    return float(np.quantile(values, q)), float(ordered[lo]), float(ordered[hi])


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; sane at 0 and n successes."""
    if n <= 0:
        raise ValueError("n must be positive")
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(x: F64, z: float = Z95) -> tuple[float, float]:
    """Mean and the half-width of its normal 95% interval (0 for one sample)."""
    n = x.size
    half = z * float(x.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    return float(x.mean()), half


def _ratio(num: F64, den: F64) -> F64:
    # the published convention: nothing proposed counts as everything served
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def per_seed(wl: Workload, out: Outcome) -> dict[str, F64]:
    """Per-seed metrics, each (S,). Exposure and shortfall are in units of R."""
    m = wl.model
    r = m.tolerance
    window = (out.exec_tick // m.ticks).clip(max=m.windows - 1)
    realised = np.where(out.executed, wl.residual, 0.0)
    by_window = np.stack([(realised * (window == w)).sum(axis=1) for w in range(m.windows)], 1)
    honest = ~wl.frag
    proposed = np.where(out.gated & honest, wl.value, 0.0)
    served = np.where(out.executed & honest, wl.value, 0.0)
    last = window == m.windows - 1
    res: dict[str, F64] = {
        "overdraw": (by_window.max(axis=1) > r).astype(float),
        "overdraw_last": (by_window[:, -1] > r).astype(float),
        "exposure_last": by_window[:, -1] / r,
        "worst_window": by_window.max(axis=1) / r,
        "util_last": _ratio((served * last).sum(1), (proposed * last).sum(1)),
        "exposure": by_window.sum(axis=1) / r,
        "shortfall": np.clip(by_window - r, 0.0, None).sum(axis=1) / r,
        "utility": _ratio(served.sum(1), proposed.sum(1)),
        "denied": (out.gated & ~out.executed).sum(axis=1).astype(float),
        "escalated": out.escalated.sum(axis=1).astype(float),
        "moved": np.where(out.executed & wl.frag, wl.value, 0.0).sum(axis=1),
        "overruns": out.overruns.astype(float),
    }
    for name, ph in (("pre", PRE), ("burst", BURST), ("post", POST)):
        mask = wl.phase == ph
        res[f"util_{name}"] = _ratio((served * mask).sum(1), (proposed * mask).sum(1))
    return res


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Over-seed summary of one arm in one experiment."""

    seeds: int
    p_overdraw: float
    p_overdraw_lo: float
    p_overdraw_hi: float
    exposure: float
    exposure_ci: float
    exposure_p95: float
    # each seed's worst window / R (what R bounds; one window: its exposure) at the
    # EXPOSURE_Q percents; the last is exposure_max
    worst_window_q: tuple[float, ...]
    exposure_max: float  # the worst window of any seed, the figure R bounds
    # each seed's worst window / R at WORST_Q, with its 95% interval (quantile_ci)
    worst_q99: float
    worst_q99_lo: float
    worst_q99_hi: float
    shortfall: float  # E[(S - R)+] / R, S a window's realised exposure, summed over windows
    utility: float
    utility_ci: float
    # the last window alone: with several windows, what a steady state looks like
    p_overdraw_last: float
    p_overdraw_last_lo: float
    p_overdraw_last_hi: float
    exposure_last: float
    exposure_last_ci: float
    exposure_last_q: tuple[float, ...]  # the last window's exposure / R at EXPOSURE_Q
    exposure_last_max: float
    util_last: float
    util_last_ci: float
    util_pre: float
    util_burst: float
    util_post: float
    denied: float
    escalated: float
    moved: float
    overruns: float


def summarize(seed_metrics: dict[str, F64]) -> Summary:
    od = seed_metrics["overdraw"]
    lo, hi = wilson(int(od.sum()), od.size)
    exp_mean, exp_ci = mean_ci(seed_metrics["exposure"])
    util_mean, util_ci = mean_ci(seed_metrics["utility"])
    od_last = seed_metrics["overdraw_last"]
    last_lo, last_hi = wilson(int(od_last.sum()), od_last.size)
    last_mean, last_ci = mean_ci(seed_metrics["util_last"])
    last_exp, last_exp_ci = mean_ci(seed_metrics["exposure_last"])

    def avg(key: str) -> float:
        return float(seed_metrics[key].mean())

    return Summary(
        seeds=od.size,
        p_overdraw=float(od.mean()),
        p_overdraw_lo=lo,
        p_overdraw_hi=hi,
        exposure=exp_mean,
        exposure_ci=exp_ci,
        exposure_p95=float(np.quantile(seed_metrics["exposure"], 0.95)),
        worst_window_q=tuple(
            float(q) for q in np.percentile(seed_metrics["worst_window"], EXPOSURE_Q)
        ),
        exposure_max=float(seed_metrics["worst_window"].max()),
        **dict(zip(WORST_FIELDS, quantile_ci(seed_metrics["worst_window"], WORST_Q), strict=True)),
        shortfall=avg("shortfall"),
        utility=util_mean,
        utility_ci=util_ci,
        p_overdraw_last=float(od_last.mean()),
        p_overdraw_last_lo=last_lo,
        p_overdraw_last_hi=last_hi,
        exposure_last=last_exp,
        exposure_last_ci=last_exp_ci,
        exposure_last_q=tuple(
            float(q) for q in np.percentile(seed_metrics["exposure_last"], EXPOSURE_Q)
        ),
        exposure_last_max=float(seed_metrics["exposure_last"].max()),
        util_last=last_mean,
        util_last_ci=last_ci,
        util_pre=avg("util_pre"),
        util_burst=avg("util_burst"),
        util_post=avg("util_post"),
        denied=avg("denied"),
        escalated=avg("escalated"),
        moved=avg("moved"),
        overruns=avg("overruns"),
    )
