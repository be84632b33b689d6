"""Pricing's face: `pricing` exports exactly this API, its namespace holds nothing
public beside it but its own modules, and the product packages outside pricing/
(the ledger, the gateway, the simulator, the shell) import pricing only through it:
`from pricing import X`, never a module of pricing's. Tests of pricing itself may
reach its modules; the product may not."""

from __future__ import annotations
import __future__

import ast
from pathlib import Path
from types import ModuleType

import pricing

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("ledger", "gateway", "sim", "irrev")
SUBMODULES = frozenset(p.stem for p in (ROOT / "pricing").glob("*.py")) - {"__init__"}

PUBLIC_API = {
    # a tenant's policy: loaded, checked, compiled for serving
    "load_policy_text",
    "load_policy_data",
    "load_document",
    "parse_yaml",
    "compile_policy",
    "merge_documents",
    "policy_schema",
    "PolicyError",
    "Finding",
    "TenantPolicy",
    # the document's parts and values
    "PolicyDocument",
    "AdminRole",
    "BodyFormat",
    "EffectClass",
    "McpErrorMeaning",
    "Rate",
    "RequestLimits",
    "SecretSource",
    "UnknownRouteAction",
    "MemberId",
    "TenantId",
    "ToolName",
    "duration_ms",
    "OPERATOR_FIELDS",
    "OPERATOR_TOOL_FIELDS",
    # which headers cross the gateway, and the bodies it takes
    "GATEWAY_HEADER_PREFIXES",
    "METHOD_OVERRIDE_HEADERS",
    "NEVER_RETURNED",
    "MEDIA_TYPES",
    # a decoded path as the forward sends it, and as a person reads it
    "wire_path",
    # agents and their credentials
    "AuthenticatedAgent",
    "agent_for_token",
    "agent_for_token_hash",
    "format_token",
    "hash_token",
    "TOKEN_BYTES",
    # an agent an operator stopped (`agents.<id>.suspended`)
    "Suspension",
    "SuspensionReason",
    # pricing a request
    "Catalog",
    "CompiledRoute",
    "PricedEffect",
    "price_request",
    "priced_for",
    "stressed",
    "Stress",
    "check_route_scope",
    "is_shadow",
    "CALL",
    "call_route",
    "RequestError",
    "AmountError",
    "BadAmount",
    "BadRiskFactor",
    "UnknownRoute",
    "RouteNotAllowed",
    # a request's quote (`irrev policy price`)
    "Quote",
    "Refusal",
    "agent_by_id",
    "quote_request",
    "quote_json",
    "quote_lines",
    # the accounts a policy opens and a hold debits
    "PolicyAccount",
    "policy_account",
    "policy_accounts",
    "factor_account",
    "hold_accounts",
    "shadow_hold",
    "check_per_effect_cap",
    "PerEffectCapExceeded",
    "FACTOR_PREFIX",
    "SHADOW_PREFIX",
    "MAX_HOLD_ACCOUNTS",
    # pricing models
    "PricingSpec",
    "FacePricing",
    "ExpectedPricing",
    "QuantilePricing",
    "StressedPricing",
    "BetaShape",
    "FailureBound",
    "MODEL_TAGS",
    "expected_lgd",
    "quantile_lgd",
    "stressed_lgd",
    "vasicek_pd",
    "p_fail_value",
    "trip_threshold",
    "cusum_jump",
    "cusum_decay",
    "cusum_run_end",
    "cusum_step",
    "cusum_at",
    "margin_kept",
    "stress_margin",
    "Cusum",
    "CusumState",
    "CusumStep",
    "calm_rate",
    # what settled holds teach: learned outcomes, self-calibrating prices
    "Outcomes",
    "with_observed",
    "with_settled",
    "apply_learning",
    "FailurePosterior",
    "RecoveryPosterior",
    "Evidence",
    "Prior",
    "RouteQuote",
    "route_quote",
    "factor_ppm",
    "pooled_pending",
    "TOP_KEPT",
    # amounts and instants
    "MAX_MICROS",
    "major_to_minor",
    "minor_to_major_text",
    "money_text",
    "round_up",
    "with_money_text",
    "journal_money",
    "header_money",
    "rfc3339",
}


def test_the_face_exports_exactly_the_public_api() -> None:
    assert len(pricing.__all__) == len(set(pricing.__all__))
    assert set(pricing.__all__) == PUBLIC_API
    for name in PUBLIC_API:
        assert hasattr(pricing, name), name


def test_the_namespace_holds_nothing_public_beside_the_face() -> None:
    """As httpx's test_exported_members: a name imported into `pricing/__init__`
    is exported, or not there (its modules and the __future__ import aside)."""
    public = {
        name
        for name, value in vars(pricing).items()
        if not name.startswith("_") and not isinstance(value, ModuleType | __future__._Feature)
    }
    assert public == set(pricing.__all__)


def violations(source: str, where: str) -> list[str]:
    """Each import, at any depth of `source`, of a module of pricing's."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "pricing":
                modules += [f"pricing.{alias.name}" for alias in node.names]
        else:
            continue
        found += [
            f"{where}:{node.lineno} imports {module}"
            for module in modules
            if module.startswith("pricing.") and module.split(".")[1] in SUBMODULES
        ]
    return found


def test_the_product_imports_pricing_only_through_its_face() -> None:
    files = sorted(path for package in OUTSIDE for path in (ROOT / package).rglob("*.py"))
    assert {path.relative_to(ROOT).parts[0] for path in files} == set(OUTSIDE)
    found = [
        violation
        for path in files
        for violation in violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == [], (
        "import these from `pricing` (add what is missing to pricing/__init__.py's "
        "__all__ and this module's PUBLIC_API):\n" + "\n".join(found)
    )


def test_the_check_sees_every_way_to_reach_a_module() -> None:
    sample = (
        "import pricing\n"
        "import pricing.catalog\n"
        "from pricing import TenantPolicy, money\n"
        "from pricing.policy import EffectClass\n"
        "def f():\n"
        "    from pricing.units import rfc3339\n"
    )
    assert violations(sample, "m.py") == [
        "m.py:2 imports pricing.catalog",
        "m.py:3 imports pricing.money",
        "m.py:4 imports pricing.policy",
        "m.py:6 imports pricing.units",
    ]
