"""Variants of examples/procurement.yaml that several test modules build their tenants
from: top-level keys to pass to `new_tenant` (tests/gateway/conftest.py), e.g.

    @pytest.fixture(scope="module")
    def tight(new_tenant: TenantMaker) -> Tenant:
        return new_tenant("tight", accounts=example_accounts(tenant={"limit": "1"}))

A variant that one module alone uses lives in that module.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from .servers import EXAMPLES

PROCUREMENT: dict[str, Any] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())


def example_accounts(**replaced: Any) -> dict[str, Any]:
    """The example's accounts, with top-level entries (`tenant`, `principals`, ...)
    replaced."""
    accounts: dict[str, Any] = copy.deepcopy(PROCUREMENT["accounts"])
    return {**accounts, **replaced}


def example_routes() -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = copy.deepcopy(PROCUREMENT["routes"])
    return routes


def order_routes(**fields: Any) -> list[dict[str, Any]]:
    """The example's routes, with `fields` set on its supplier orders (POST /orders)."""
    routes = example_routes()
    for route in routes:
        if route["route"] == "POST /orders":
            route.update(fields)
    return routes


def tools_at(url: str) -> dict[str, Any]:
    """The example's tools, with every one that has an upstream sending to `url`."""
    return {"supplier": {"upstream": url}, "payments": {"upstream": url}, "deploy": {}}


# The example's routes with the in-process deploy route compensable (a rollback
# recovers most of it), its p_fail learned from rollbacks, and agents' overrun
# reports allowed.
LEARNED_DEPLOY: dict[str, Any] = {
    "tool": "deploy",
    "route": "POST /deploys",
    "class": "compensable",
    "face_value_fixed": "1000",
    "in_process": True,
    "overrun_report": True,
    "pricing": {
        "model": "expected",
        "recovery": {"alpha": 19, "beta": 1},
        "p_fail": {"alpha": 1, "beta": 99, "level": 0.95},
    },
}
LEARNING_ROUTES = [
    LEARNED_DEPLOY if route["tool"] == "deploy" else route for route in example_routes()
]


def keyless_orders() -> dict[str, Any]:
    """Supplier orders sent without an Idempotency-Key keyed by their content (issue
    29), and roomy accounts for the escalations its tests make."""
    roomy = example_accounts(tenant={"limit": "10000000"})
    roomy["principals"]["procurement"] = {"limit": "10000000"}
    roomy["risk_factors"]["supplier:*"] = {"limit": "10000000"}
    return {"routes": order_routes(keyless="content"), "accounts": roomy}


def flooded_orders() -> dict[str, Any]:
    """Every supplier order above 50 USD waits for a human."""
    return {"routes": order_routes(approval_threshold="50")}
