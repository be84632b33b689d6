"""Beta posteriors learned from settled effects, and their conservative bounds.

Two things are learned per route: how often compensation fails (`FailurePosterior`,
which replaces `p_fail` by an *upper* credible bound) and how much compensation
recovers (`RecoveryPosterior`, which moves the recovery distribution's mean to a
*lower* credible bound). Bounds, not point estimates, because a budget that is
priced optimistically overdraws exactly when the estimate was lucky.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from pricing.distributions import beta_ppf


@lru_cache(maxsize=4096)
def beta_quantile(level: float, alpha: float, beta: float) -> float:
    """The `level` quantile of Beta(alpha, beta), cached: prices are hot, the inverse
    takes a few continued fractions."""
    return beta_ppf(level, alpha, beta)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"credible level {level!r} must be strictly between 0 and 1")


def _check_shape(alpha: float, beta: float) -> None:
    if not (math.isfinite(alpha) and math.isfinite(beta) and alpha > 0 and beta > 0):
        raise ValueError(f"Beta({alpha!r}, {beta!r}) needs finite positive parameters")


@dataclass(frozen=True, slots=True)
class FailurePosterior:
    """Beta(alpha, beta) over the probability that a compensation fails.

    alpha counts failures (plus the prior's pseudo-failures), beta successes.
    """

    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self) -> None:
        _check_shape(self.alpha, self.beta)

    def observe(self, *, compensated: int, failed: int) -> FailurePosterior:
        if compensated < 0 or failed < 0:
            raise ValueError("outcome counts are never negative")
        return FailurePosterior(self.alpha + failed, self.beta + compensated)

    def upper_bound(self, level: float) -> float:
        """p_fail to price with: exceeded with posterior probability 1 - level."""
        _check_level(level)
        return beta_quantile(level, self.alpha, self.beta)


@dataclass(frozen=True, slots=True)
class RecoveryPosterior:
    """Beta(alpha, beta) over the mean recovered fraction of a route's effects.

    Each realised fraction r counts as r pseudo-successes and 1 - r pseudo-failures,
    the usual conjugate treatment of fractional outcomes.
    """

    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self) -> None:
        _check_shape(self.alpha, self.beta)

    def observe(self, fractions: Iterable[float]) -> RecoveryPosterior:
        alpha, beta = self.alpha, self.beta
        for r in fractions:
            if not (math.isfinite(r) and 0.0 <= r <= 1.0):
                raise ValueError(f"recovered fraction {r!r} must be within [0, 1]")
            alpha += r
            beta += 1.0 - r
        return RecoveryPosterior(alpha, beta)

    def lower_bound(self, level: float) -> float:
        """Mean recovery to price with: undershot with posterior probability 1 - level."""
        _check_level(level)
        return beta_quantile(1.0 - level, self.alpha, self.beta)

    def recovery_shape(self, level: float, concentration: float) -> tuple[float, float]:
        """Beta(a, b) for the recovery of one effect, centred on `lower_bound(level)`.

        The spread (a + b = `concentration`) stays what the policy configured: a few
        dozen settlements say much about the mean and little about the tails.
        """
        if not (math.isfinite(concentration) and concentration > 0):
            raise ValueError(f"concentration {concentration!r} must be positive")
        mean = min(max(self.lower_bound(level), 1e-9), 1.0 - 1e-9)
        return mean * concentration, (1.0 - mean) * concentration
