"""The JSON Schema of a tenant policy file, for editors (`irrev policy schema`).

Generated from the document model, so it cannot drift from what the loader accepts
field by field; the cross-field checks (pricing.validation) are beyond a schema and
stay with `irrev policy validate`.
"""

from __future__ import annotations

from typing import Any

from pricing.policy import PolicyDocument

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def policy_schema() -> dict[str, Any]:
    """The schema of one policy file as written (YAML keys: `window`, `class`, ...)."""
    schema = PolicyDocument.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": SCHEMA_DIALECT,
        **schema,
        "title": "irrev tenant policy",
        "description": "One tenant's policy file: accounts, agents, tools and the route "
        "catalog. Amounts are in major units of risk_unit; see docs/policy.md.",
    }
