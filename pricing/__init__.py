"""irrev pricing: pure functions from a tenant policy and a request to an integer price.

No I/O: no redis, fastapi, httpx, os, time or random. Every input is a parameter.
"""

from __future__ import annotations

from pricing.accounts import (
    MAX_HOLD_ACCOUNTS,
    PolicyAccount,
    check_per_effect_cap,
    factor_account,
    hold_accounts,
    policy_accounts,
)
from pricing.catalog import Catalog, CompiledRoute, PricedEffect
from pricing.credentials import AuthenticatedAgent, format_token, hash_token
from pricing.errors import (
    AmountError,
    BadAmount,
    BadRiskFactor,
    Finding,
    PerEffectCapExceeded,
    PolicyError,
    RequestError,
    UnknownRoute,
)
from pricing.learning import FailurePosterior, RecoveryPosterior
from pricing.loader import load_document, load_policy_data, load_policy_text, parse_yaml
from pricing.models import (
    MODEL_TAGS,
    BetaShape,
    ExpectedPricing,
    FacePricing,
    FailureBound,
    PricingSpec,
    QuantilePricing,
    StressedPricing,
    apply_learning,
    expected_lgd,
    quantile_lgd,
    stressed_lgd,
    vasicek_pd,
)
from pricing.money import MAX_MICROS, major_to_minor, minor_to_major_text, round_up
from pricing.observed import Outcomes, with_observed
from pricing.policy import EffectClass, PolicyDocument, UnknownRouteAction
from pricing.scopes import RouteNotAllowed
from pricing.serving import (
    TenantPolicy,
    agent_for_token,
    agent_for_token_hash,
    check_route_scope,
    compile_policy,
    price_request,
)

__all__ = [
    "MAX_HOLD_ACCOUNTS",
    "MAX_MICROS",
    "MODEL_TAGS",
    "AmountError",
    "AuthenticatedAgent",
    "BadAmount",
    "BadRiskFactor",
    "BetaShape",
    "Catalog",
    "CompiledRoute",
    "EffectClass",
    "ExpectedPricing",
    "FacePricing",
    "FailureBound",
    "FailurePosterior",
    "Finding",
    "Outcomes",
    "PerEffectCapExceeded",
    "PolicyAccount",
    "PolicyDocument",
    "PolicyError",
    "PricedEffect",
    "PricingSpec",
    "QuantilePricing",
    "RecoveryPosterior",
    "RequestError",
    "RouteNotAllowed",
    "StressedPricing",
    "TenantPolicy",
    "UnknownRoute",
    "UnknownRouteAction",
    "agent_for_token",
    "agent_for_token_hash",
    "apply_learning",
    "check_per_effect_cap",
    "check_route_scope",
    "compile_policy",
    "expected_lgd",
    "factor_account",
    "format_token",
    "hash_token",
    "hold_accounts",
    "load_document",
    "load_policy_data",
    "load_policy_text",
    "major_to_minor",
    "minor_to_major_text",
    "parse_yaml",
    "policy_accounts",
    "price_request",
    "quantile_lgd",
    "round_up",
    "stressed_lgd",
    "vasicek_pd",
    "with_observed",
]
