"""irrev pricing: pure functions from a tenant policy and a request to an integer price.

No I/O: no redis, fastapi, httpx, os, time or random. Every input is a parameter.

This is pricing's face: the gateway, the simulator and the shell import from
`pricing`, never from its modules, which are pricing's own business.
"""

from __future__ import annotations

from pricing.accounts import (
    MAX_HOLD_ACCOUNTS,
    SHADOW_PREFIX,
    PolicyAccount,
    check_per_effect_cap,
    factor_account,
    hold_accounts,
    policy_account,
    policy_accounts,
    shadow_hold,
)
from pricing.calibration import (
    TOP_KEPT,
    Evidence,
    Prior,
    RouteQuote,
    factor_ppm,
    pooled_pending,
    route_quote,
)
from pricing.catalog import Catalog, CompiledRoute, PricedEffect, priced_for
from pricing.credentials import TOKEN_BYTES, AuthenticatedAgent, format_token, hash_token
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
from pricing.headers import GATEWAY_HEADER_PREFIXES, METHOD_OVERRIDE_HEADERS, NEVER_RETURNED
from pricing.learning import FailurePosterior, RecoveryPosterior
from pricing.loader import load_document, load_policy_data, load_policy_text, parse_yaml
from pricing.merge import merge_documents
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
    p_fail_value,
    quantile_lgd,
    stressed_lgd,
    vasicek_pd,
)
from pricing.money import MAX_MICROS, major_to_minor, minor_to_major_text, money_text, round_up
from pricing.observed import Outcomes, with_observed, with_settled
from pricing.policy import (
    OPERATOR_FIELDS,
    OPERATOR_TOOL_FIELDS,
    AdminRole,
    BodyFormat,
    EffectClass,
    McpErrorMeaning,
    PolicyDocument,
    Rate,
    RequestLimits,
    SecretSource,
    UnknownRouteAction,
)
from pricing.quote import Quote, Refusal, agent_by_id, quote_json, quote_lines, quote_request
from pricing.reading import MEDIA_TYPES
from pricing.schema import policy_schema
from pricing.scopes import RouteNotAllowed
from pricing.serving import (
    TenantPolicy,
    agent_for_token,
    agent_for_token_hash,
    check_route_scope,
    compile_policy,
    is_shadow,
    price_request,
)
from pricing.stress import calm_rate, cusum_decay, cusum_jump, cusum_run_end, trip_threshold
from pricing.templates import CALL, FACTOR_PREFIX, call_route
from pricing.units import header_money, journal_money, rfc3339, with_money_text
from pricing.values import MemberId, TenantId, ToolName, duration_ms

__all__ = [
    "CALL",
    "FACTOR_PREFIX",
    "GATEWAY_HEADER_PREFIXES",
    "MAX_HOLD_ACCOUNTS",
    "MAX_MICROS",
    "MEDIA_TYPES",
    "METHOD_OVERRIDE_HEADERS",
    "MODEL_TAGS",
    "NEVER_RETURNED",
    "OPERATOR_FIELDS",
    "OPERATOR_TOOL_FIELDS",
    "SHADOW_PREFIX",
    "TOKEN_BYTES",
    "TOP_KEPT",
    "AdminRole",
    "AmountError",
    "AuthenticatedAgent",
    "BadAmount",
    "BadRiskFactor",
    "BetaShape",
    "BodyFormat",
    "Catalog",
    "CompiledRoute",
    "EffectClass",
    "Evidence",
    "ExpectedPricing",
    "FacePricing",
    "FailureBound",
    "FailurePosterior",
    "Finding",
    "McpErrorMeaning",
    "MemberId",
    "Outcomes",
    "PerEffectCapExceeded",
    "PolicyAccount",
    "PolicyDocument",
    "PolicyError",
    "PricedEffect",
    "PricingSpec",
    "Prior",
    "QuantilePricing",
    "Quote",
    "Rate",
    "RecoveryPosterior",
    "Refusal",
    "RequestError",
    "RequestLimits",
    "RouteNotAllowed",
    "RouteQuote",
    "SecretSource",
    "StressedPricing",
    "TenantId",
    "TenantPolicy",
    "ToolName",
    "UnknownRoute",
    "UnknownRouteAction",
    "agent_by_id",
    "agent_for_token",
    "agent_for_token_hash",
    "apply_learning",
    "call_route",
    "calm_rate",
    "check_per_effect_cap",
    "check_route_scope",
    "compile_policy",
    "cusum_decay",
    "cusum_jump",
    "cusum_run_end",
    "duration_ms",
    "expected_lgd",
    "factor_account",
    "factor_ppm",
    "format_token",
    "hash_token",
    "header_money",
    "hold_accounts",
    "is_shadow",
    "journal_money",
    "load_document",
    "load_policy_data",
    "load_policy_text",
    "major_to_minor",
    "merge_documents",
    "minor_to_major_text",
    "money_text",
    "p_fail_value",
    "parse_yaml",
    "policy_account",
    "policy_accounts",
    "policy_schema",
    "pooled_pending",
    "price_request",
    "priced_for",
    "quantile_lgd",
    "quote_json",
    "quote_lines",
    "quote_request",
    "rfc3339",
    "round_up",
    "route_quote",
    "shadow_hold",
    "stressed_lgd",
    "trip_threshold",
    "vasicek_pd",
    "with_money_text",
    "with_observed",
    "with_settled",
]
