"""Self-calibrating hold prices: a route's residual-loss factor learned from settled holds.

An effect of face value v leaves a residual loss x v, x in [0, 1]. The catalog states a
prior for x (its Beta recovery and p_fail); every settled hold reveals a realised x. A
hold still unsettled is priced at a factor f of its face value, built from three bounds
(bounds, not point estimates: a price that is optimistic by luck overdraws):

1. **Mean.** The mean of x pooled with `weight` prior pseudo-observations at the
   catalog's mean and variance, plus z standard errors: an upper credible bound
   (the normal approximation to the posterior of a mean).
2. **Tail.** The catalog's tail quantile q_(1 - alpha) scaled by how far the mean's
   upper bound lies above the catalog's mean (a world whose losses are k times the catalog's has
   its tail k times as far out, up to face value), and never below what the
   settlements prove: the e-th largest
   factor seen, where e is the fewest exceedances that a true (1 - alpha) quantile
   would produce with probability below 1 - confidence (a one-sided binomial test).
   A route whose compensation fails now and then shows factors of 1 and is priced
   at face value, whatever its catalog says.
3. **Pooling over the pending.** The overdraw a hold can cause is the pending holds'
   summed overrun. With m holds pending on the route at once, the sum exceeds m f
   with probability about alpha for f = mean + luck / sqrt(m), luck the larger of
   tail - mean and z_(1 - alpha) sd (a tail capped at face value understates one
   hold's spread): exact for m = 1, where f is the tail, the central limit theorem's
   1/sqrt(m) for many. Pooling averages out each hold's luck, never a wrong mean, and
   a mispriced catalog is a wrong mean; so a route pools only once `POOL_MIN` of its
   own settlements bound its mean without the prior (their mean plus z_0.99 standard
   errors, never below the posterior's bound), and its sd is never taken below the
   catalog's. A route without that evidence prices every hold at its tail, however
   many are pending.

Pure arithmetic and one cached binomial table: the simulator calls `hold_factor` per
seed; the gateway calls it through `route_factor` for every route whose policy says
`calibrate`, from the factors its settlements recorded (`Evidence.from_ppm`), so a
route's price is the number the simulator measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from pricing.distributions import beta_cdf, normal_ppf
from pricing.models import QuantilePricing, p_fail_value, quantile_lgd

TOP_KEPT = 16  # largest factors a route keeps: enough for the tail test to n ~ 8,000 at 0.001
PPM = 1_000_000  # the gateway records factors in integer parts per million: sums stay exact


@dataclass(frozen=True, slots=True)
class Prior:
    """What the catalog says of a route's residual factor x, and how much it weighs."""

    mean: float
    variance: float
    tail: float  # q_(1 - alpha)(x)
    weight: float  # prior pseudo-observations

    def __post_init__(self) -> None:
        if not 0.0 < self.mean <= self.tail <= 1.0:
            raise ValueError(
                f"prior mean {self.mean} and tail {self.tail} need 0 < mean <= tail <= 1"
            )
        if self.variance < 0 or self.weight <= 0:
            raise ValueError("prior variance must be >= 0 and its weight > 0")

    @classmethod
    def from_catalog(
        cls, alpha: float, beta: float, p_fail: float, level: float, weight: float
    ) -> Prior:
        """x = (1 - r) + r p_fail with r ~ Beta(alpha, beta) (pricing.models.lgd)."""
        s = alpha + beta
        mean_r, var_r = alpha / s, alpha * beta / (s * s * (s + 1))
        mean = 1.0 - mean_r * (1.0 - p_fail)
        variance = var_r * (1.0 - p_fail) ** 2
        return cls(mean, variance, quantile_lgd(alpha, beta, p_fail, level), weight)


@dataclass(frozen=True, slots=True)
class Evidence:
    """Sufficient statistics of a route's settled factors: count, sums, largest few."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    top: tuple[float, ...] = ()  # descending, at most TOP_KEPT

    @classmethod
    def from_ppm(cls, n: int, total: int, total_sq: int, top: tuple[int, ...]) -> Evidence:
        """Evidence from integer sums of factors in parts per million (the gateway's)."""
        if n < 0 or not 0 <= total <= n * PPM or not 0 <= total_sq <= n * PPM * PPM:
            raise ValueError(f"settled factor sums n={n}, {total}, {total_sq} are not consistent")
        if any(not 0 <= t <= PPM for t in top):
            raise ValueError(f"settled factors {top} must be within 0..{PPM} ppm")
        ranked = tuple(t / PPM for t in sorted(top, reverse=True)[:TOP_KEPT])
        return cls(n, total / PPM, total_sq / (PPM * PPM), ranked)

    def observe(self, factor: float) -> Evidence:
        if not (math.isfinite(factor) and 0.0 <= factor <= 1.0):
            raise ValueError(f"a realised residual factor {factor!r} must be within [0, 1]")
        top = tuple(sorted((*self.top, factor), reverse=True)[:TOP_KEPT])
        return replace(
            self,
            n=self.n + 1,
            total=self.total + factor,
            total_sq=self.total_sq + factor * factor,
            top=top,
        )


def posterior_mean(prior: Prior, ev: Evidence) -> float:
    return (prior.weight * prior.mean + ev.total) / (prior.weight + ev.n)


def mean_bound(prior: Prior, ev: Evidence, confidence: float) -> float:
    """Upper credible bound on the route's mean factor, in [prior-or-data mean, 1]."""
    w = prior.weight + ev.n
    mean = posterior_mean(prior, ev)
    second = (prior.weight * (prior.variance + prior.mean**2) + ev.total_sq) / w
    sd = math.sqrt(max(second - mean * mean, 0.0))
    return min(1.0, mean + normal_ppf(confidence) * sd / math.sqrt(w))


@lru_cache(maxsize=65536)
def exceedances_needed(n: int, alpha: float, confidence: float) -> int:
    """Fewest of n factors at or above a value that prove it below the (1 - alpha)
    quantile: P(Binomial(n, alpha) >= e) < 1 - confidence. n + 1 if none can."""
    for e in range(1, n + 1):
        # P(Binomial(n, p) >= e) = I_p(e, n - e + 1)
        if beta_cdf(alpha, e, n - e + 1) < 1.0 - confidence:
            return e
    return n + 1


def proven_tail(ev: Evidence, alpha: float, confidence: float) -> float:
    """A lower confidence bound on the (1 - alpha) quantile from the settled factors
    alone (0 when they cannot bound it)."""
    e = exceedances_needed(ev.n, alpha, confidence)
    if e > len(ev.top):
        return 0.0
    return ev.top[e - 1]


# settlements of a route's own before its mean may be pooled on: with 5 (and the t
# quantile) irrev-cal overdrew 0 of 300 tuning seeds (100000-) at every point of the
# Pareto grid; 10 kept 0.004 less utility at d = 200, k = 1.5
POOL_MIN = 5
# the data-only bound on the mean that pooling prices from: at 0.95 irrev-cal overdrew
# 1 of 300 tuning seeds at k = 2-3, d = 50-200, none at 0.99
POOL_CONFIDENCE = 0.99


@dataclass(frozen=True, slots=True)
class Quote:
    """A route's price as a function of how many of its holds are pending at once."""

    tail: float  # a hold standing alone
    mean: float  # an upper bound on the mean: what each of very many pending holds costs
    poolable: float  # the most pending holds whose luck may average out
    luck: float = 0.0  # z_(1 - alpha) sd: one hold's overrun at the tail's level

    def factor(self, pending: float) -> float:
        if pending <= 0 or not math.isfinite(pending):
            raise ValueError(f"expected pending holds {pending!r} must be positive")
        m = max(1.0, min(pending, self.poolable))
        return min(self.tail, self.mean + max(self.tail - self.mean, self.luck) / math.sqrt(m))


def data_mean_bound(ev: Evidence, confidence: float) -> tuple[float, float]:
    """An upper confidence bound on the mean from the settled factors alone, and their
    sample sd (n >= 2)."""
    if ev.n < 2:
        raise ValueError(f"{ev.n} settled factors cannot bound a mean; 2 or more can")
    mean = ev.total / ev.n
    sd = math.sqrt(max(ev.total_sq / ev.n - mean * mean, 0.0) * ev.n / (ev.n - 1))
    return min(1.0, mean + student_t_ppf(confidence, ev.n - 1) * sd / math.sqrt(ev.n)), sd


def student_t_ppf(p: float, df: int) -> float:
    """Student's t quantile by its Cornish-Fisher expansion about the normal's
    (Abramowitz and Stegun 26.7.5): within 1% of the exact (a little below) from 4
    degrees of freedom at p = 0.99. A few settlements' own sd is itself uncertain; the
    normal's quantile would trust it (irrev-cal overdrew 2 of 300 tuning seeds at
    d = 5, k = 3 with it, none with this)."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least 1 degree of freedom, not {df}")
    z = normal_ppf(p)
    z3, z5, z7 = z**3, z**5, z**7
    return (
        z
        + (z3 + z) / (4 * df)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * df**2)
        + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df**3)
    )


def quote(prior: Prior, ev: Evidence, *, alpha: float, confidence: float = 0.95) -> Quote:
    """The route's price for any number of pending holds (see the module doc)."""
    mean = mean_bound(prior, ev, confidence)
    # the tail moves with the mean's upper bound, not its point estimate: scaling by
    # the posterior mean instead kept 0.02 more utility at k = 1 but overdrew 1-2% of
    # seeds at k = 2-3 where this overdraws none (300 seeds per point, d = 0-50)
    scaled = prior.tail * max(mean, prior.mean) / prior.mean
    tail = min(1.0, max(scaled, proven_tail(ev, alpha, confidence), mean))
    if ev.n < POOL_MIN:
        return Quote(tail, mean, 1.0)
    bound, sd = data_mean_bound(ev, POOL_CONFIDENCE)
    spread = max(sd, math.sqrt(prior.variance))
    return Quote(tail, min(tail, max(mean, bound)), math.inf, normal_ppf(1.0 - alpha) * spread)


def hold_factor(
    prior: Prior, ev: Evidence, *, pending: float, alpha: float, confidence: float = 0.95
) -> float:
    """The factor of face value to hold an unsettled effect at, with `pending` holds
    of its route pending at once (itself included)."""
    return quote(prior, ev, alpha=alpha, confidence=confidence).factor(pending)


def factor_ppm(realised: int, face_value: int) -> int:
    """A settled effect's residual factor in ppm, rounded up (a loss is never
    understated); at most PPM."""
    if face_value <= 0 or realised < 0:
        raise ValueError(f"realised {realised} of face value {face_value} has no factor")
    return min(PPM, -(-realised * PPM // face_value))


def route_factor(spec: QuantilePricing, ev: Evidence) -> float:
    """A calibrating quantile route's loss factor given its settled evidence: the
    policy's recovery and p_fail as the prior, its `level` as the tail quantile."""
    cal = spec.calibrate
    if cal is None:
        raise ValueError("the route's pricing has no `calibrate`")
    p_fail = p_fail_value(spec.p_fail)
    prior = Prior.from_catalog(
        spec.recovery.alpha, spec.recovery.beta, p_fail, spec.level, cal.weight
    )
    factor = hold_factor(
        prior, ev, pending=cal.pending, alpha=1.0 - spec.level, confidence=cal.confidence
    )
    return factor * (1.0 + spec.surcharge)
