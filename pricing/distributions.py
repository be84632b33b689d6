"""The Normal and Beta functions pricing needs, in plain Python.

scipy computes these too, but importing `scipy.stats` costs the CLI and every gateway
worker about two seconds for three functions; tests/pricing checks these against scipy
to 1e-12.

Beta: the regularized incomplete beta I_x(a, b) by its continued fraction (modified
Lentz), on whichever side of the mean it converges; the factor x^a (1 - x)^b / B(a, b)
in front of it is taken in logarithms arranged so that large shapes do not cancel
(TOMS 708's `brcomp`: Stirling's series with its correction terms). The quantile is
found by Newton steps on the logarithm of the tail being matched, so that tails far
below 1e-16 keep their relative precision, with bisection whenever a step leaves the
bracket.
"""

from __future__ import annotations

import math
from statistics import NormalDist

_STANDARD_NORMAL = NormalDist()
_LN_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# Bernoulli numbers B_2k / (2k (2k - 1)): the terms of Stirling's series, enough for
# 1e-17 at z >= _STIRLING_FROM.
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
_STIRLING_FROM = 10.0
_SERIES_BELOW = 0.1
_TINY = 1e-300
_CF_EPS = 1e-16
_CF_MAX_TERMS = 100_000
_NEWTON_MAX_STEPS = 200


def normal_cdf(x: float) -> float:
    """Phi(x), by erfc: NormalDist.cdf (1 + erf) rounds the lower tail below 1e-17 to 0."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def normal_ppf(p: float) -> float:
    """Phi^-1(p) for 0 < p < 1."""
    return _STANDARD_NORMAL.inv_cdf(p)


def beta_cdf(x: float, a: float, b: float) -> float:
    """I_x(a, b): P(X <= x) for X ~ Beta(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_lower, _ = _log_tails(x, a, b, _log_front(x, a, b))
    return math.exp(log_lower)


def beta_ppf(p: float, a: float, b: float) -> float:
    """The p quantile of Beta(a, b): the x with I_x(a, b) = p.

    Below the median it matches the lower tail p, above it the upper tail 1 - p
    (exact in floating point there), each by its logarithm.
    """
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    upper = p > 0.5
    target = math.log1p(-p) if upper else math.log(p)
    lo, hi = 0.0, 1.0
    x = _initial_guess(p, a, b)
    for _ in range(_NEWTON_MAX_STEPS):
        log_front = _log_front(x, a, b)
        log_tail = _log_tails(x, a, b, log_front)[upper]
        # The lower tail rises with x, the upper tail falls.
        if (log_tail > target) != upper:
            hi = x
        else:
            lo = x
        # d(log tail)/dx = +-pdf/tail, and pdf = front / (x (1 - x)).
        log_slope = log_front - math.log(x) - math.log1p(-x) - log_tail
        step = (log_tail - target) * math.exp(min(-log_slope, 700.0))
        after = x + step if upper else x - step
        # Newton converges quadratically: once a step is this small, the next one
        # would move x by nothing a float can hold.
        if abs(after - x) <= 1e-14 * min(x, 1.0 - x):
            return after
        if not lo < after < hi:
            after = _midpoint(lo, hi)
            if after in (lo, hi):  # adjacent floats; 0 when the quantile underflows
                return after
        x = after
    return x


def _log_tails(x: float, a: float, b: float, log_front: float) -> tuple[float, float]:
    """(ln I_x(a, b), ln (1 - I_x(a, b))) for 0 < x < 1: the continued fraction for
    the tail on x's side of the mean, the other one as its complement."""
    if x < (a + 1.0) / (a + b + 2.0):
        log_lower = log_front + math.log(_continued_fraction(x, 1.0 - x, a, b) / a)
        return log_lower, _log1m_exp(log_lower)
    log_upper = log_front + math.log(_continued_fraction(1.0 - x, x, b, a) / b)
    return _log1m_exp(log_upper), log_upper


def _continued_fraction(x: float, complement: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf), by modified Lentz.

    Its first denominator 1 - (a + b) x / (a + 1) is small near the mean; above 1/2 it
    is taken from `complement` = 1 - x, the one of the two that is exact there (with
    x = 1 - 3e-6 rounded from 3e-6, 1 - x would keep five digits of it).
    """
    if x <= 0.5:
        first = 1.0 - (a + b) * x / (a + 1.0)
    else:
        first = ((1.0 - b) + (a + b) * complement) / (a + 1.0)
    c = 1.0
    d = 1.0 / _nonzero(first)
    h = d
    for m in range(1, _CF_MAX_TERMS):
        even = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        d = 1.0 / _nonzero(1.0 + even * d)
        c = _nonzero(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        d = 1.0 / _nonzero(1.0 + odd * d)
        c = _nonzero(1.0 + odd / c)
        delta = d * c
        h *= delta
        if abs(delta - 1.0) <= _CF_EPS:
            return h
    raise ArithmeticError(f"I_x(a, b) did not converge for x={x!r}, a={a!r}, b={b!r}")


def _nonzero(value: float) -> float:
    return value if abs(value) >= _TINY else _TINY


def _log_front(x: float, a: float, b: float) -> float:
    """ln (x^a (1 - x)^b / B(a, b)) for 0 < x < 1."""
    if min(a, b) >= _STIRLING_FROM:
        return _log_front_large(x, a, b)
    if b >= _STIRLING_FROM:
        return _log_front_one_large(a, b, math.log(x), math.log1p(-x))
    if a >= _STIRLING_FROM:
        return _log_front_one_large(b, a, math.log1p(-x), math.log(x))
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    return a * math.log(x) + b * math.log1p(-x) - log_beta


def _log_front_large(x: float, a: float, b: float) -> float:
    """Both shapes large: ln B(a, b) by Stirling's series cancels against a ln x and
    b ln(1 - x) term by term, leaving
        1/2 ln(a b / (2 pi s)) + a g(x s / a - 1) + b g((1 - x) s / b - 1) - corrections,
    s = a + b and g(t) = ln(1 + t) - t, whose arguments are small near the mean."""
    s = a + b
    excess = x * s - a
    correction = _stirling(a) + _stirling(b) - _stirling(s)
    return (
        0.5 * math.log(a * b / s)
        - _LN_SQRT_2PI
        + _scaled_log1pmx(a, excess, x * s)
        + _scaled_log1pmx(b, -excess, (1.0 - x) * s)
        - correction
    )


def _log_front_one_large(
    small: float, large: float, log_small_side: float, log_large_side: float
) -> float:
    """One shape below _STIRLING_FROM: ln Gamma(large) - ln Gamma(small + large) by
    Stirling (TOMS 708's `algdiv`), so that the two large lgammas never meet.

    `log_small_side` is the log of the variable whose power is `small` (ln x when the
    small shape is a), `log_large_side` the other one."""
    s = small + large
    return (
        small * (log_small_side + math.log(s))
        - math.lgamma(small)
        - small
        + large * log_large_side
        + (large - 0.5) * math.log1p(small / large)
        - (_stirling(large) - _stirling(s))
    )


def _scaled_log1pmx(n: float, excess: float, total: float) -> float:
    """n (ln(total / n) - excess / n), where total = n + excess; by its series when
    excess / n is small, where the two logarithms would cancel."""
    t = excess / n
    if abs(t) >= _SERIES_BELOW:
        return n * (math.log(total / n) - t)
    # ln(1 + t) - t = -t^2/2 + t^3/3 - ...
    term, k, acc = -t * t, 2, 0.0
    while True:
        piece = term / k
        acc += piece
        if abs(piece) <= 1e-17 * abs(acc):
            return n * acc
        term *= -t
        k += 1


def _stirling(z: float) -> float:
    """ln Gamma(z) - ((z - 1/2) ln z - z + ln sqrt(2 pi)), for z >= _STIRLING_FROM."""
    inverse_square = 1.0 / (z * z)
    acc = 0.0
    for coefficient in reversed(_STIRLING):
        acc = acc * inverse_square + coefficient
    return acc / z


def _log1m_exp(log_p: float) -> float:
    """ln(1 - e^log_p) for log_p <= 0, without the cancellation of either form alone."""
    if log_p > -math.log(2.0):
        return math.log(-math.expm1(log_p)) if log_p < 0.0 else -math.inf
    return math.log1p(-math.exp(log_p))


def _midpoint(lo: float, hi: float) -> float:
    """Bisect [lo, hi]: geometrically near 0 or 1, where a bracket may span hundreds of
    orders of magnitude, arithmetically in between."""
    smallest = math.ulp(0.0)
    if hi <= 0.5 and hi > 4.0 * lo:
        middle = math.sqrt(max(lo, smallest)) * math.sqrt(hi)
    elif lo >= 0.5 and 1.0 - lo > 4.0 * (1.0 - hi):
        middle = 1.0 - math.sqrt(1.0 - lo) * math.sqrt(max(1.0 - hi, smallest))
    else:
        middle = 0.5 * (lo + hi)
    return middle if lo < middle < hi else 0.5 * (lo + hi)


def _initial_guess(p: float, a: float, b: float) -> float:
    """Numerical Recipes' start for the inverse (`invbetai`): a normal approximation
    (Abramowitz & Stegun 26.5.22) when both shapes are at least 1, the power law of
    each tail otherwise. Any start in (0, 1) converges; a good one saves steps."""
    if a >= 1.0 and b >= 1.0:
        tail = min(p, 1.0 - p)
        t = math.sqrt(-2.0 * math.log(tail))
        z = (2.30753 + t * 0.27061) / (1.0 + t * (0.99229 + t * 0.04481)) - t
        if p < 0.5:
            z = -z
        al = (z * z - 3.0) / 6.0
        h = 2.0 / (1.0 / (2.0 * a - 1.0) + 1.0 / (2.0 * b - 1.0))
        w = z * math.sqrt(al + h) / h - (1.0 / (2.0 * b - 1.0) - 1.0 / (2.0 * a - 1.0)) * (
            al + 5.0 / 6.0 - 2.0 / (3.0 * h)
        )
        guess = a / (a + b * math.exp(min(2.0 * w, 700.0)))
    else:
        lower = math.exp(a * math.log(a / (a + b))) / a
        upper = math.exp(b * math.log(b / (a + b))) / b
        total = lower + upper
        if p < lower / total:
            guess = (a * total * p) ** (1.0 / a)
        else:
            guess = 1.0 - (b * total * (1.0 - p)) ** (1.0 / b)
    return guess if 0.0 < guess < 1.0 else 0.5
