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
   summed overrun. With m holds pending on the route at once and n of its own
   settlements (mean c, sd s), the mean factor of the m exceeds
   c + luck sqrt(1/m + 1/n) with probability about alpha: the prediction bound of
   the mean of m new draws, whose 1/n term is the uncertainty of c itself, with
   luck = max(tail - c, t_(n-1)(1 - alpha / LOOKS) s) (a tail capped at face value
   understates one hold's spread; a few settlements' s is uncertain, hence Student's
   t, and never below the catalog's sd scaled as its tail is). For m = 1 that is at
   least the tail, and the price is the tail; for many it nears c by as much as n
   allows. Pooling averages out each hold's luck, never a wrong mean, and a
   mispriced catalog is a wrong mean: so the pooled centre is the route's own
   settlements, not the prior, it needs `POOL_MIN` of them, and it never goes below
   the posterior's bound (1.). A route without them prices every hold at its tail,
   however many are pending.

Pure arithmetic and one cached binomial table: the simulator calls `hold_factor` per
seed; the gateway prices every route whose policy says `calibrate` through the same
`RouteQuote` (`route_pooling`), from the factors its settlements recorded
(`Evidence.from_ppm`) and the route's holds open across the fleet at that moment
(counted by the ledger's hold scripts, by Kish's effective number of their face
values as the simulator counts them, at most the policy's `calibrate.pending`: 1 by
default, every hold alone; a policy opts into pooling with a number above 1 or
'live'), so a route's price is the number the simulator measures: the same function of the same
two things. The one difference is on the safe side: the gateway knows the open set
as of its last reserve on the route, and prices for one Poisson standard deviation
fewer holds (`pooled_pending`); the ledger keeps the hold only while the set is at
least that large, so no hold is priced for more holds than were open when it was
kept, and prices it again otherwise.
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


# settlements of a route's own before it pools (Student's t below is within 1% of the
# exact from 9 degrees of freedom); 5 overdrew where one unlucky handful set the mean
POOL_MIN = 10
# a burst's pending set is priced again at every hold it gains, some tens of looks at
# one sum, and a sum of a few skewed factors is not yet normal: each look is held to
# alpha / LOOKS. With 1 irrev-cal overdrew 1-3 of 2,000 tuning seeds (100000-) at
# k = 2, d = 20 and 200; with 10, none at the six points tried (k = 1-2, d = 20-200),
# for 0.004 less utility
LOOKS = 10


@dataclass(frozen=True, slots=True)
class RouteQuote:
    """A route's price as a function of how many of its holds are pending at once."""

    tail: float  # a hold standing alone
    mean: float  # the posterior's upper bound on the mean: no price goes below it
    settled: int = 0  # the route's own settlements it pools on (0: it does not pool)
    centre: float = 0.0  # their mean
    luck: float = 0.0  # one hold's overrun: max(tail - centre, t_(n-1) sd)

    def factor(self, pending: float) -> float:
        if pending <= 0 or not math.isfinite(pending):
            raise ValueError(f"expected pending holds {pending!r} must be positive")
        if self.settled == 0:
            return self.tail
        m = max(1.0, pending)
        pooled = self.centre + self.luck * math.sqrt(1.0 / m + 1.0 / self.settled)
        return min(self.tail, max(self.mean, pooled))


def route_quote(
    prior: Prior, ev: Evidence, *, alpha: float, confidence: float = 0.95
) -> RouteQuote:
    """The route's price for any number of pending holds (see the module doc)."""
    mean = mean_bound(prior, ev, confidence)
    # the tail moves with the mean's upper bound, not its point estimate: scaling by
    # the posterior mean instead kept 0.02 more utility at k = 1 but overdrew 1-2% of
    # seeds at k = 2-3 where this overdraws none (300 seeds per point, d = 0-50)
    scaled = prior.tail * max(mean, prior.mean) / prior.mean
    tail = min(1.0, max(scaled, proven_tail(ev, alpha, confidence), mean))
    if ev.n < POOL_MIN:
        return RouteQuote(tail, mean)
    centre = ev.total / ev.n
    sd = math.sqrt(max(ev.total_sq / ev.n - centre * centre, 0.0) * ev.n / (ev.n - 1))
    # a few settlements can agree by luck: never a spread below the catalog's, scaled
    # as its tail is (a world k times as lossy spreads about k times as far)
    spread = max(sd, math.sqrt(prior.variance) * max(centre, prior.mean) / prior.mean)
    luck = max(tail - centre, student_t_ppf(1.0 - alpha / LOOKS, ev.n - 1) * spread)
    return RouteQuote(tail, mean, ev.n, centre, luck)


def student_t_ppf(p: float, df: int) -> float:
    """Student's t quantile by its Cornish-Fisher expansion about the normal's
    (Abramowitz and Stegun 26.7.5): a little below the exact, by 0.2% at 9 degrees of
    freedom and p = 0.999, 0.6% at p = 0.9999. A few settlements' own sd is itself
    uncertain; the normal's quantile would trust it."""
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


def hold_factor(
    prior: Prior, ev: Evidence, *, pending: float, alpha: float, confidence: float = 0.95
) -> float:
    """The factor of face value to hold an unsettled effect at, with `pending` holds
    of its route pending at once (itself included)."""
    return route_quote(prior, ev, alpha=alpha, confidence=confidence).factor(pending)


def factor_ppm(realised: int, face_value: int) -> int:
    """A settled effect's residual factor in ppm, rounded up (a loss is never
    understated); at most PPM."""
    if face_value <= 0 or realised < 0:
        raise ValueError(f"realised {realised} of face value {face_value} has no factor")
    return min(PPM, -(-realised * PPM // face_value))


@dataclass(frozen=True, slots=True)
class Pooling:
    """A calibrating route's price as a function of its holds pending at once: its
    `RouteQuote`, its surcharge, and `cap`, the policy's `calibrate.pending`: the most holds
    its price may pool over, however many are open (infinite: no cap)."""

    quote: RouteQuote
    surcharge: float
    cap: float = math.inf

    def factor(self, pending: float) -> float:
        """The loss factor of a hold with `pending` holds of its route open at once
        (itself included), counted at most `cap`."""
        return self.quote.factor(min(self.cap, pending)) * (1.0 + self.surcharge)


def route_pooling(spec: QuantilePricing, ev: Evidence) -> Pooling:
    """A calibrating quantile route's price given its settled evidence: the policy's
    recovery and p_fail as the prior, its `level` as the tail quantile."""
    cal = spec.calibrate
    if cal is None:
        raise ValueError("the route's pricing has no `calibrate`")
    p_fail = p_fail_value(spec.p_fail)
    prior = Prior.from_catalog(
        spec.recovery.alpha, spec.recovery.beta, p_fail, spec.level, cal.weight
    )
    q = route_quote(prior, ev, alpha=1.0 - spec.level, confidence=cal.confidence)
    return Pooling(q, spec.surcharge, cal.pending_cap)


def route_factor(spec: QuantilePricing, ev: Evidence, pending: float = 1.0) -> float:
    """A calibrating quantile route's loss factor given its settled evidence, with
    `pending` of its holds open at once (counted at most `calibrate.pending`): what
    `hold_factor` gives for them, with the route's surcharge."""
    return route_pooling(spec, ev).factor(pending)


def pooled_pending(effective: float) -> float:
    """The number of pending holds a gateway prices a calibrating route's hold for,
    given `effective`, the route's open set with this hold as the gateway last saw
    it (Kish's effective number, as the simulator counts it): one Poisson standard
    deviation fewer, at least 1. A price made for more holds than are open would be
    too low, so the ledger keeps a hold only while the open set is at least this
    large (ledger/lua/reserve.lua, else it is priced again for the set as it is):
    the slack makes that rare when the set merely wobbled since it was seen."""
    if not math.isfinite(effective) or effective < 1.0:
        raise ValueError(f"an effective number of pending holds {effective!r} must be >= 1")
    return max(1.0, effective - math.sqrt(effective))
