"""Model parameters: the published fleet model by default, plus irrev's extensions.

Money here is float USD because the published model is float; the irrev arms turn
amounts into int64 micro-USD once, rounding up (`to_micros`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.stats import beta as beta_dist

MICROS_PER_USD = 1_000_000


@dataclass(frozen=True, kw_only=True)
class ProductLine:
    """One product line: value and recovery distributions, and the supplier it buys from."""

    value_mu: float = 9.6
    value_sigma: float = 0.5
    recovery_a: float = 6.0
    recovery_b: float = 2.0
    supplier: int = 0
    # the world's recovery Beta, where it is not what the catalog prices (a user's
    # workload that says its own recovery); None: the world is as priced
    world_a: float | None = None
    world_b: float | None = None

    @property
    def world_shape(self) -> tuple[float, float]:
        if self.world_a is None or self.world_b is None:
            return self.recovery_a, self.recovery_b
        return self.world_a, self.world_b


@dataclass(frozen=True, kw_only=True)
class Spike:
    """A supplier price spike during the burst, driven by one shared factor x in [lo, 1].

    The same x multiplies order value by (1 + value_gain * x) and scales recovery by
    (1 - recovery_loss * x): the spike that makes agents buy also makes purchases dearer
    and harder to undo.
    """

    value_gain: float = 0.5
    recovery_loss: float = 0.5
    severity_lo: float = 0.5
    supplier: int = 0


@dataclass(frozen=True, kw_only=True)
class Model:
    """The world: fleet, workload, burst, per-call gate and tenant tolerance R."""

    n_agents: int = 50
    ticks: int = 1000  # one budget window
    windows: int = 1  # consecutive windows; the burst falls in the first
    p_base: float = 0.0005
    p_burst: float = 0.05
    burst_len: int = 50
    lines: tuple[ProductLine, ...] = (ProductLine(),)
    value_cap: float = 50_000.0
    rate_limit: int = 20
    tolerance: float = 250_000.0
    # correlated recovery (published E8): burst-time recovery Beta(corr_a, corr_b)
    correlated: bool = False
    corr_a: float = 2.0
    corr_b: float = 6.0
    spike: Spike | None = None
    # probability that compensation fails and the whole value is lost (DESIGN p_fail)
    p_comp_fail: float = 0.0
    # mispricing: the world's residual loss is `misprice` times what the catalog prices.
    # "scale": each residual factor 1 - r is multiplied by k (capped at the face value);
    # "shape": recovery is drawn from another Beta, of the same concentration a + b and
    # mean residual k times the catalog's (k = 3 on Beta(6, 2) is Beta(2, 6))
    misprice: float = 1.0
    misprice_shape: Literal["scale", "shape"] = "scale"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.misprice) and self.misprice > 0):
            raise ValueError(f"misprice {self.misprice!r} must be a positive factor")
        if self.misprice_shape == "shape":
            for ln in self.lines:
                a, b = ln.world_shape
                if self.misprice * b >= a + b:
                    raise ValueError(
                        f"misprice {self.misprice} with shape: Beta({a}, "
                        f"{b}) has no Beta of mean residual {self.misprice} x "
                        "its own; use a smaller factor or --misprice-shape scale"
                    )
        if not 0 < self.burst_len < self.ticks - 200:
            raise ValueError(
                f"burst length {self.burst_len} must be positive and leave 200 ticks of "
                f"the {self.ticks}-tick window (the burst starts in [100, T - len - 100))"
            )

    @property
    def horizon(self) -> int:
        return self.ticks * self.windows

    def with_(self, **changes: object) -> Model:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Attack:
    """Fragmentation: `total` USD in `piece`-sized orders from `colluders`, one per tick.

    `declared_factor` is the residual factor the agent claims for its fragments (a
    refundable-class quantile); gates that trust the agent charge that, irrev prices
    from the catalog class and ignores it.
    """

    total: float = 1_500_000.0
    piece: float = 10_000.0
    colluders: int = 10
    declared_factor: float | None = None


@dataclass(frozen=True)
class Scenario:
    """A model plus an optional attack; what one column of CRN workloads is drawn from."""

    model: Model = field(default_factory=Model)
    attack: Attack | None = None


def residual_quantile(q: float, recovery_a: float, recovery_b: float) -> float:
    """q-quantile of the residual factor 1 - r, r ~ Beta(a, b)."""
    return float(1.0 - beta_dist.ppf(1.0 - q, recovery_a, recovery_b))


def to_micros(usd: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The one rounding rule from float USD to ledger units: round up."""
    return np.ceil(usd * MICROS_PER_USD).astype(np.int64)


def usd_to_micros(usd: float) -> int:
    return math.ceil(usd * MICROS_PER_USD)
