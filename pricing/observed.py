"""Prices that learn from compensation outcomes (pure).

A route whose `p_fail` is a posterior (`{alpha, beta, level}` in the policy) is priced
with its upper credible bound; every compensation the gateway sees on that route is
one more observation: a failure (nothing recovered) adds to alpha, a success to beta.
`with_observed` turns the policy as written plus the outcomes counted so far into the
policy to price with; `with_settled` does the same for calibrating routes
(pricing/calibration.py) from the residual factors settled holds revealed. A fixed
`p_fail` (a plain number) is the operator's word and is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pricing.calibration import Evidence
from pricing.models import ExpectedPricing, FailureBound, QuantilePricing, StressedPricing
from pricing.serving import TenantPolicy, compile_policy

Learnable = ExpectedPricing | QuantilePricing | StressedPricing
# The policy's own bound on a Beta parameter (pricing.models.Positive).
MAX_SHAPE = 1e6
MIN_SHAPE = 1e-9


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Compensations observed on one route: how many recovered nothing, how many some."""

    failures: int = 0
    successes: int = 0

    def __post_init__(self) -> None:
        if self.failures < 0 or self.successes < 0:
            raise ValueError("outcome counts are never negative")


def saturated(alpha: float, beta: float) -> tuple[float, float]:
    """(alpha, beta) scaled down together until both are within MAX_SHAPE: the same
    failure rate, the evidence of a million outcomes. Counts that grew past what a
    policy may state must never make the learned policy invalid."""
    if max(alpha, beta) <= MAX_SHAPE:
        return alpha, beta
    if alpha >= beta:
        return MAX_SHAPE, max(beta * (MAX_SHAPE / alpha), MIN_SHAPE)
    return max(alpha * (MAX_SHAPE / beta), MIN_SHAPE), MAX_SHAPE


def with_observed(policy: TenantPolicy, observed: Mapping[str, Outcomes]) -> TenantPolicy:
    """`policy` with each learnable route's posterior moved by its observed outcomes
    (keyed by route id, as `CompiledRoute.route_id`): its document with the learned
    posteriors, compiled afresh. `policy` itself is unchanged."""
    ids = {r.index: r.route_id for group in policy.catalog.routes.values() for r in group}
    routes = list(policy.document.routes)
    for index, route in enumerate(routes):
        seen = observed.get(ids.get(index, ""))
        spec = route.pricing
        if seen is None or not isinstance(spec, Learnable):
            continue
        if not isinstance(spec.p_fail, FailureBound):
            continue
        prior = spec.p_fail
        alpha, beta = saturated(prior.alpha + seen.failures, prior.beta + seen.successes)
        posterior = FailureBound(alpha=alpha, beta=beta, level=prior.level)
        routes[index] = route.model_copy(
            update={"pricing": spec.model_copy(update={"p_fail": posterior})}
        )
    return compile_policy(policy.document.model_copy(update={"routes": routes}), policy.evidence)


def with_settled(policy: TenantPolicy, evidence: Mapping[str, Evidence]) -> TenantPolicy:
    """`policy` with each calibrating route (`pricing.calibrate`) priced from the
    residual factors its settled holds revealed (keyed by route id), compiled afresh
    from the same document; `policy` itself is unchanged."""
    return compile_policy(policy.document, evidence)
