"""A user's world: a tenant policy (as the gateway serves it) and a workload file.

`irrev sim run --policy P --workload W` simulates a team's own fleet instead of the
published one. The policy gives what the gateway would do: the route's price (pricing's
`loss_factor`, the number the gateway reserves), the tenant's tolerance R, the
fleet's principal limit, the agent's per-effect and window caps, the route's
risk-factor limit and the soft band. The workload gives what the world does: fleet
size, call rates, the burst, value and recovery distributions, settlement delay,
human approval latency, seeds and windows.

Self-calibration is the policy's: a route calibrates in the simulation only if its
pricing says `calibrate:` (as the gateway calibrates only such a route), with the
policy's prior (its recovery and p_fail, worth `weight` settlements), confidence,
surcharge and `pending` cap; the workload cannot turn it on or off.

Not simulated (`NOT_SIMULATED`, in every run's JSON): per-route approval thresholds,
several routes or principals at once, hold TTL expiry. The fleet calls one route;
its calls spread over `factor_values` risk-factor values (agent i always names value
i mod N), and self-calibration learns per value, so it learns no faster than that.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pricing import (
    EffectClass,
    ExpectedPricing,
    PricingSpec,
    QuantilePricing,
    StressedPricing,
    TenantPolicy,
    factor_account,
    p_fail_value,
)
from sim.arms import Budget, Local
from sim.calibrated import Pricing
from sim.experiments import Arms, Case, Experiment
from sim.irrev import Irrev
from sim.params import Model, ProductLine, Scenario

NOT_SIMULATED = (
    "per-route approval thresholds, several routes or principals at once, hold TTL expiry"
)

PositiveFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
PerTick = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]  # calls per agent a tick
Ticks = Annotated[int, Field(ge=0, strict=True)]


class WorkloadError(ValueError):
    """A workload file that cannot be simulated against its policy; one line, says why."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Shape(_Spec):
    """Beta(alpha, beta) of the fraction compensation recovers."""

    alpha: PositiveFloat
    beta: PositiveFloat


class Value(_Spec):
    """Face value of one call: lognormal with this median (major units) and log-sd."""

    median: PositiveFloat
    sigma: Annotated[float, Field(ge=0.0, le=5.0, allow_inf_nan=False)]


class Burst(_Spec):
    """A correlated burst in the first window: every agent's call rate jumps to `rate`
    per tick for `length` ticks; `recovery` (optional) is the burst's own recovery."""

    rate: PerTick
    length: Annotated[int, Field(gt=0, strict=True)]
    recovery: Shape | None = None


class WorkloadSpec(_Spec):
    """What a team's fleet does, in ticks (a window is `ticks` long)."""

    route: str = Field(description="'<tool> <METHOD> <path template>' of the policy")
    agent: str = Field(description="the policy's agent every fleet member is a copy of")
    agents: Annotated[int, Field(gt=0, le=100_000, strict=True)]
    ticks: Annotated[int, Field(gt=200, le=1_000_000, strict=True)] = 1000
    windows: Annotated[int, Field(gt=0, le=100, strict=True)] = 1
    call_rate: PerTick = Field(description="calls per agent per tick, in calm")
    burst: Burst | None = None
    value: Value
    recovery: Shape | None = Field(
        default=None, description="the world's recovery (default: what the route prices)"
    )
    compensation_fails: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    misprice: PositiveFloat = 1.0
    factor_values: Annotated[int, Field(gt=0, le=1000, strict=True)] = Field(
        default=1,
        description="distinct values of the route's risk factor (suppliers) the calls "
        "spread over: agent i always names value i mod N; each is its own account",
    )
    rate_limit: Annotated[int, Field(gt=0, strict=True)] = 20
    settle_delay: Ticks = 20
    approval_latency: Ticks = 0
    escalation_ttl: Ticks | None = None
    approvals: Ticks = 50
    seeds: Annotated[int, Field(gt=0, le=1_000_000, strict=True)] = 300
    seed0: Annotated[int, Field(ge=0, strict=True)] = 500_000


def parse_workload(data: object, source: str) -> WorkloadSpec:
    """A checked workload, or WorkloadError naming the first wrong field."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{source}: a workload must be a mapping (key: value)")
    if "calibrate" in data:
        raise WorkloadError(
            f"{source}: calibrate: whether a route calibrates is its policy's (its "
            "pricing's `calibrate:`, docs/policy.md), as the gateway has it; remove it here"
        )
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        got = "" if err["type"] == "missing" else f", got {err['input']!r}"
        raise WorkloadError(f"{source}: {where}: {err['msg']}{got}{more}") from None


def _route(policy: TenantPolicy, route_id: str) -> tuple[int, str]:
    for group in policy.catalog.routes.values():
        for r in group:
            if r.route_id == route_id:
                return r.index, r.route_id
    known = sorted(r.route_id for g in policy.catalog.routes.values() for r in g)
    raise WorkloadError(f"route {route_id!r} is not in the policy; it has: {', '.join(known)}")


def world(policy: TenantPolicy, spec: WorkloadSpec, source: str) -> Experiment:
    """The experiment a policy and a workload describe: the policy as irrev, beside the
    published ledger (`budget`) and no gate (`local`) in the same world."""
    doc, scale = policy.document, policy.scale
    index, route_id = _route(policy, spec.route)
    route = doc.routes[index]
    if route.effect_class is EffectClass.READ:
        raise WorkloadError(f"route {route_id!r} is a read: it costs nothing to simulate")
    agent = doc.agents.get(spec.agent)
    if agent is None:
        raise WorkloadError(f"agent {spec.agent!r} is not in the policy's agents")
    pricing = route.pricing
    compiled = next(r for g in policy.catalog.routes.values() for r in g if r.index == index)
    tolerance = doc.accounts.tenant.limit / scale
    principal = doc.accounts.principals[agent.principal].limit / scale
    catalog, p_fail = _catalog_recovery(pricing)
    value_cap = agent.per_effect_cap / scale
    model = _model(spec, catalog, p_fail, value_cap=value_cap, tolerance=tolerance, source=source)
    factor_limit = _factor_limit(policy, route.risk_factors)
    level = getattr(pricing, "level", 0.999)
    # the policy's escalation TTL in ticks of its window, unless the workload says
    ttl = spec.escalation_ttl
    if ttl is None and spec.approval_latency > 0:
        ttl = max(spec.approval_latency, round(doc.escalation_ttl_ms / doc.window_ms * spec.ticks))
    # The policy's calibrate.pending, as the gateway prices it: 1 (the default) every
    # hold alone, a number the most holds a price pools over, 'live' the open count.
    cal = pricing.calibrate if isinstance(pricing, QuantilePricing) else None
    cap = cal.pending_cap if cal is not None else 1.0
    irrev = Irrev(
        hold_quantile=level,
        pending=1.0 if cap <= 1 else None,
        pending_cap=cap,
        settle_delay=spec.settle_delay,
        soft_frac=doc.accounts.tenant.soft_band or doc.soft_band,
        approvals=spec.approvals,
        approval_latency=spec.approval_latency,
        escalation_ttl=ttl,
        calibrate=cal is not None,
        calibration=_calibration(pricing, p_fail),
        agent_limit_frac=agent.window_cap / scale / tolerance,
        supplier_limit_frac=None if factor_limit is None else factor_limit / tolerance,
        top_limit_frac=min(1.0, principal / tolerance),
        price_factor=compiled.loss_factor,
    )
    arms: Arms = (("local", Local()), ("budget", Budget()), ("policy", irrev))
    case = Case(f"{doc.tenant}: {route_id}", Scenario(model), arms, spec.seed0)
    return Experiment("run", f"{doc.tenant}'s fleet on {route_id} ({source})", (case,))


def _catalog_recovery(pricing: PricingSpec | None) -> tuple[tuple[float, float], float]:
    """The Beta shape of what compensation recovers, as the route's pricing believes
    it, and the chance compensation fails."""
    if isinstance(pricing, ExpectedPricing | QuantilePricing | StressedPricing):
        return (pricing.recovery.alpha, pricing.recovery.beta), p_fail_value(pricing.p_fail)
    return (1.0, 1.0), 1.0  # face: nothing is recovered, whatever happens


def _calibration(pricing: PricingSpec | None, p_fail: float) -> Pricing:
    """A calibrating route's prior and bounds as `pricing.route_pooling` builds them:
    the policy's p_fail (never the world's), weight, confidence and surcharge."""
    if not isinstance(pricing, QuantilePricing) or pricing.calibrate is None:
        return Pricing(p_fail=p_fail)
    cal = pricing.calibrate
    return Pricing(
        p_fail=p_fail,
        prior_weight=cal.weight,
        confidence=cal.confidence,
        surcharge=pricing.surcharge,
    )


def _model(
    spec: WorkloadSpec,
    catalog: tuple[float, float],
    p_fail: float,
    *,
    value_cap: float,
    tolerance: float,
    source: str,
) -> Model:
    """The world the workload describes: one product line per risk-factor value,
    priced with the `catalog` recovery shape, recovering what the workload says the
    world does (the catalog's shape unless it says otherwise)."""
    world_shape = spec.recovery or Shape(alpha=catalog[0], beta=catalog[1])
    lines = tuple(
        ProductLine(
            value_mu=math.log(spec.value.median),
            value_sigma=spec.value.sigma,
            recovery_a=catalog[0],
            recovery_b=catalog[1],
            world_a=world_shape.alpha,
            world_b=world_shape.beta,
            supplier=i,
        )
        for i in range(spec.factor_values)
    )
    burst = spec.burst
    try:
        return Model(
            n_agents=spec.agents,
            ticks=spec.ticks,
            windows=spec.windows,
            p_base=spec.call_rate,
            p_burst=burst.rate if burst else spec.call_rate,
            burst_len=burst.length if burst else 1,
            lines=lines,
            value_cap=value_cap,
            rate_limit=spec.rate_limit,
            tolerance=tolerance,
            correlated=bool(burst and burst.recovery),
            corr_a=burst.recovery.alpha if burst and burst.recovery else 2.0,
            corr_b=burst.recovery.beta if burst and burst.recovery else 6.0,
            p_comp_fail=p_fail if spec.compensation_fails is None else spec.compensation_fails,
            misprice=spec.misprice,
        )
    except ValueError as e:
        raise WorkloadError(f"{source}: {e}") from None


def _factor_limit(policy: TenantPolicy, templates: list[str]) -> float | None:
    """The tightest limit of the route's risk-factor accounts, in major units. Every
    call of the fleet names one factor value (the sim's one supplier); an exact
    entry in the policy is a value the fleet does not name, so the wildcard governs."""
    limits = []
    for template in templates:
        concrete = re.sub(r"\{[^}]*\}", "sim", template)
        spec = factor_account(policy, concrete)
        if spec is not None:
            limits.append(spec.limit_micros / policy.scale)
    return min(limits) if limits else None
