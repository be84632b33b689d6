"""Pricing models: the fraction of a face value that an effect may leave lost.

Every model returns a *loss factor* f with price = round_up(face value x f). The loss
given default of one effect is LGD = (1 - r) + r p_fail: r is the fraction that
compensation recovers, p_fail the probability that compensation fails. Recovery r is
Beta(alpha, beta) distributed. Without a surcharge f <= 1: nothing costs more than
its face value.

- `face`: f = 1. For irreversible, unknown or unverified effects.
- `expected`: f = E[LGD] = 1 - E[r] (1 - p_fail). Cheap, and right only for effects
  that settle quickly to their realised residual.
- `quantile`: f = q_level(LGD) = 1 - q_(1 - level)(r) (1 - p_fail), the published
  ledger's charge c = v q_gamma(1 - r) (0.521 for Beta(6, 2) at gamma = 0.95). An
  unsettled hold should sit near level 0.999.
- `stressed`: the quantile model conditional on a one-factor (Vasicek) shock. With
  Z the systematic factor at its stress quantile q, compensation fails with
      p_q = Phi((Phi^-1(p_fail) + sqrt(rho) Phi^-1(q)) / sqrt(1 - rho))
  and, because severity worsens under the same factor, recovery is driven by the
  same Gaussian factor through a copula, r = F^-1(Phi(X)) with
  X = sqrt(rho) Z + sqrt(1 - rho) e; its (1 - level) conditional quantile is
      r_q = F^-1(Phi(sqrt(1 - rho) Phi^-1(1 - level) - sqrt(rho) Phi^-1(q)))
  (F the Beta(alpha, beta) CDF), and f = (1 - r_q) + r_q p_q. With rho = 0 this is
  exactly the quantile model; every rho > 0 and q > 1/2 prices higher.

Any model may add a configured `surcharge` s >= 0: f' = f (1 + s). It is the one
way a price can exceed the face value.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, Strict

from pricing.distributions import normal_cdf, normal_ppf
from pricing.learning import FailurePosterior, RecoveryPosterior, beta_quantile

# Strict: YAML `true` or `"0.5"` where a number belongs is a mistake, not a 1.0 or 0.5.
Probability = Annotated[float, Strict(), Field(ge=0.0, le=1.0, allow_inf_nan=False)]
OpenUnit = Annotated[float, Strict(), Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
Positive = Annotated[float, Strict(), Field(gt=0.0, le=1e6, allow_inf_nan=False)]
Surcharge = Annotated[float, Strict(), Field(ge=0.0, le=10.0, allow_inf_nan=False)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BetaShape(_Spec):
    """Beta(alpha, beta): the distribution of the recovered fraction r."""

    alpha: Positive
    beta: Positive


class FailureBound(_Spec):
    """p_fail as the upper credible bound of Beta(alpha, beta) at `level`.

    alpha = prior pseudo-failures + observed failures, beta = the same for successes.
    """

    alpha: Positive
    beta: Positive
    level: OpenUnit = 0.95

    def value(self) -> float:
        return FailurePosterior(self.alpha, self.beta).upper_bound(self.level)


PFail = Probability | FailureBound


def _member_name(member: object) -> str:
    """How pydantic names a union member in an error's location: its type's name."""
    base = get_args(member)[0] if get_origin(member) is Annotated else member
    return str(getattr(base, "__name__", base))


P_FAIL_TAGS: tuple[str, ...] = tuple(_member_name(m) for m in get_args(PFail))


def p_fail_value(p_fail: PFail) -> float:
    return p_fail.value() if isinstance(p_fail, FailureBound) else float(p_fail)


class FacePricing(_Spec):
    model: Literal["face"] = "face"
    surcharge: Surcharge = 0.0

    def loss_factor(self) -> float:
        return 1.0 * (1.0 + self.surcharge)


class ExpectedPricing(_Spec):
    model: Literal["expected"]
    recovery: BetaShape
    p_fail: PFail = 0.0
    surcharge: Surcharge = 0.0

    def loss_factor(self) -> float:
        f = expected_lgd(self.recovery.alpha, self.recovery.beta, p_fail_value(self.p_fail))
        return f * (1.0 + self.surcharge)


class Calibration(_Spec):
    """Price the route's unsettled holds from its settled ones (pricing/calibration.py):
    the catalog's recovery is a prior worth `weight` settlements; a hold's price pools
    its luck with the route's holds open at once across the fleet (the ledger counts
    them), once the evidence allows, over at most `pending` of them: 1 (the default,
    as before pooling existed: a policy written then keeps its prices) prices every
    hold alone, at its tail; a number above 1 opts into pooling over at most that
    many; 'live' over as many as are open, as the simulator prices."""

    weight: Positive = 20.0
    pending: (
        Annotated[float, Strict(), Field(ge=1.0, le=1e6, allow_inf_nan=False)] | Literal["live"]
    ) = 1.0
    confidence: OpenUnit = 0.95

    @property
    def pending_cap(self) -> float:
        """The most holds a price may pool over (1: none; infinite: as many as open)."""
        return math.inf if self.pending == "live" else float(self.pending)


class QuantilePricing(_Spec):
    model: Literal["quantile"]
    recovery: BetaShape
    p_fail: PFail = 0.0
    level: OpenUnit = 0.999
    surcharge: Surcharge = 0.0
    calibrate: Calibration | None = None

    def loss_factor(self) -> float:
        f = quantile_lgd(
            self.recovery.alpha, self.recovery.beta, p_fail_value(self.p_fail), self.level
        )
        return f * (1.0 + self.surcharge)


class StressedPricing(_Spec):
    model: Literal["stressed"]
    recovery: BetaShape
    p_fail: PFail = 0.0
    rho: Annotated[float, Strict(), Field(ge=0.0, lt=1.0, allow_inf_nan=False)]
    stress_quantile: OpenUnit = 0.99
    level: OpenUnit = 0.999
    surcharge: Surcharge = 0.0

    def loss_factor(self) -> float:
        f = stressed_lgd(
            self.recovery.alpha,
            self.recovery.beta,
            p_fail_value(self.p_fail),
            self.rho,
            self.stress_quantile,
            self.level,
        )
        return f * (1.0 + self.surcharge)


PricingModel = FacePricing | ExpectedPricing | QuantilePricing | StressedPricing
PricingSpec = Annotated[PricingModel, Field(discriminator="model")]


def _model_tag(spec: type[_Spec]) -> str:
    tag: str = get_args(spec.model_fields["model"].annotation)[0]
    return tag


# The one list of pricing-model tags, read off the union so a new model cannot be
# missed: a policy's `pricing.model` takes one of these.
MODEL_TAGS: tuple[str, ...] = tuple(_model_tag(spec) for spec in get_args(PricingModel))
FACE_MODEL = _model_tag(FacePricing)
# What a read route is priced with: nothing. Not a policy's choice, so not a tag above.
FREE_MODEL = "free"


def lgd(recovery: float, p_fail: float) -> float:
    """Loss given default of one effect: what compensation does not bring back."""
    return (1.0 - recovery) + recovery * p_fail


def _clamp(f: float) -> float:
    # Float noise must never price below 0 or, without a surcharge, above face.
    return min(max(f, 0.0), 1.0)


@lru_cache(maxsize=4096)
def expected_lgd(alpha: float, beta: float, p_fail: float) -> float:
    mean_recovery = alpha / (alpha + beta)
    return _clamp(lgd(mean_recovery, p_fail))


@lru_cache(maxsize=4096)
def quantile_lgd(alpha: float, beta: float, p_fail: float, level: float) -> float:
    """q_level of (1 - r) + r p_fail; LGD falls as r rises, so take r's (1 - level) quantile."""
    return _clamp(lgd(beta_quantile(1.0 - level, alpha, beta), p_fail))


@lru_cache(maxsize=4096)
def vasicek_pd(p: float, rho: float, q: float) -> float:
    """One-factor Vasicek conditional probability at factor quantile q."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    z = (normal_ppf(p) + math.sqrt(rho) * normal_ppf(q)) / math.sqrt(1.0 - rho)
    return normal_cdf(z)


@lru_cache(maxsize=4096)
def stressed_recovery(alpha: float, beta: float, rho: float, q: float, level: float) -> float:
    """(1 - level) quantile of r given the shared factor at its q stress quantile."""
    x = math.sqrt(1.0 - rho) * normal_ppf(1.0 - level) - math.sqrt(rho) * normal_ppf(q)
    return beta_quantile(normal_cdf(x), alpha, beta)


@lru_cache(maxsize=4096)
def stressed_lgd(
    alpha: float, beta: float, p_fail: float, rho: float, q: float, level: float
) -> float:
    r_q = stressed_recovery(alpha, beta, rho, q, level)
    return _clamp(lgd(r_q, vasicek_pd(p_fail, rho, q)))


LearnableSpec = ExpectedPricing | QuantilePricing | StressedPricing


def apply_learning(
    spec: LearnableSpec,
    *,
    failures: FailurePosterior | None = None,
    recovery: RecoveryPosterior | None = None,
    level: float = 0.95,
) -> LearnableSpec:
    """The same pricing with learned, conservative parameters in place of configured ones.

    `failures` replaces p_fail by its upper credible bound at `level`; `recovery`
    moves the recovery distribution's mean down to its lower credible bound at
    `level`, keeping the configured spread (alpha + beta).
    """
    update: dict[str, object] = {}
    if failures is not None:
        update["p_fail"] = failures.upper_bound(level)
    if recovery is not None:
        a, b = recovery.recovery_shape(level, spec.recovery.alpha + spec.recovery.beta)
        update["recovery"] = BetaShape(alpha=a, beta=b)
    return spec.model_copy(update=update)
