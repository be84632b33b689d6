"""`irrev policy schema` and `irrev policy price` through the installed console script."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from pricing import MODEL_TAGS, load_policy_text, price_request, round_up

from .test_cli import MALFORMED, ROOT, irrev

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

PROCUREMENT = ROOT / "examples" / "procurement.yaml"
PAYMENTS = ROOT / "examples" / "payments-api.yaml"
ORDER = {"supplier_id": "Acme-Steel", "sku": "M8", "quantity": 3, "unit_price": "14.80"}


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    result = irrev("policy", "schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: jsonschema.Draft202012Validator, document: object) -> list[str]:
    return [".".join(map(str, error.absolute_path)) for error in validator.iter_errors(document)]


def test_every_example_policy_matches_the_schema(
    validator: jsonschema.Draft202012Validator,
) -> None:
    policies = [
        path
        for path in sorted((ROOT / "examples").glob("*.yaml"))
        if yaml.safe_load(path.read_text()).get("kind", "policy") == "policy"
    ]
    assert len(policies) >= 3
    for path in policies:
        assert _errors(validator, yaml.safe_load(path.read_text())) == [], path


def test_the_schema_refuses_what_the_loader_refuses_field_by_field(
    validator: jsonschema.Draft202012Validator,
) -> None:
    unknown_class = yaml.safe_load((MALFORMED / "unknown_class.yaml").read_text())
    assert "routes.1.class" in _errors(validator, unknown_class)
    document = yaml.safe_load(PROCUREMENT.read_text())
    document["routes"][0]["face_valeu"] = "amount"
    document["window"] = 86400
    document["accounts"]["tenant"]["limit"] = "-5"
    assert set(_errors(validator, document)) == {"routes.0", "window", "accounts.tenant.limit"}


def test_the_schema_lists_every_pricing_model_and_describes_fields() -> None:
    schema = json.loads(irrev("policy", "schema").stdout)
    defs = schema["$defs"]
    route_pricing = defs["Route"]["properties"]["pricing"]["anyOf"][0]
    assert set(route_pricing["discriminator"]["mapping"]) == set(MODEL_TAGS)
    assert schema["properties"]["window"]["type"] == "string"
    assert "description" in schema["properties"]["unknown_routes"]
    assert "major units" in defs["AccountLimits"]["properties"]["limit"]["description"]


def price(*args: str | Path) -> tuple[int, dict[str, Any]]:
    result = irrev("policy", "price", *args, "--json")
    assert result.stderr == ""
    return result.returncode, json.loads(result.stdout)


def test_price_says_what_an_order_costs_and_which_accounts_pay() -> None:
    policy = load_policy_text(PROCUREMENT.read_text(), str(PROCUREMENT))
    body = {**ORDER, "unit_price": Decimal("14.80")}
    expected = price_request(policy, "supplier", "POST", "/orders", {}, body)
    code, quote = price(
        PROCUREMENT, "--route", "supplier POST /orders", "--body", json.dumps(ORDER)
    )
    assert code == 0
    assert quote["refused"] is None
    assert quote["route"] == "supplier POST /orders" and quote["matched"] is True
    assert (quote["effect_class"], quote["model"]) == ("compensable", "quantile")
    assert quote["face_value_micros"] == 44_400_000 and quote["face_value"] == "44.4"
    assert quote["face_value_fields"] == ["quantity", "unit_price"]
    assert quote["price_micros"] == round_up(44_400_000, quote["loss_factor"])
    assert quote["price_micros"] == expected.price_micros
    assert quote["risk_factors"] == ["supplier:acme-steel"]
    # Without --agent: the tenant's account and each capped factor's.
    assert quote["accounts"] == {
        "tenant:acme": expected.price_micros,
        "factor:supplier:acme-steel": expected.price_micros,
    }

    code, as_agent = price(
        PROCUREMENT,
        "--tool",
        "supplier",
        "--method",
        "post",
        "--path",
        "/orders",
        "--body",
        json.dumps(ORDER),
        "--agent",
        "buyer-01",
    )
    assert code == 0
    assert list(as_agent["accounts"]) == [
        "tenant:acme",
        "principal:procurement",
        "agent:buyer-01",
        "factor:supplier:acme-steel",
    ]
    assert set(as_agent["accounts"].values()) == {expected.price_micros}


def test_price_in_words() -> None:
    result = irrev(
        "policy",
        "price",
        PROCUREMENT,
        "--route",
        "supplier POST /orders",
        "--body",
        json.dumps(ORDER),
        "--agent",
        "buyer-01",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "route:        supplier POST /orders" in out
    assert "effect class: compensable" in out
    assert "pricing:      quantile (x0.762522 of the face value)" in out
    assert "face value:   44.4 USD (quantity * unit_price)" in out
    assert "price:        33.855958 USD" in out
    assert "factor:supplier:acme-steel  33.855958 USD" in out
    assert "refused" not in out


def test_price_reads_a_body_file_and_a_form(tmp_path: Path) -> None:
    body = tmp_path / "order.json"
    body.write_text(json.dumps(ORDER))
    code, quote = price(PROCUREMENT, "--route", "supplier POST /orders", "--body", f"@{body}")
    assert (code, quote["face_value_micros"]) == (0, 44_400_000)
    code, refund = price(
        PAYMENTS,
        "--route",
        "payments POST /v1/refunds",
        "--form",
        "--body",
        "charge=ch_1&amount=1999",
        "--agent",
        "support-01",
    )
    assert (code, refund["effect_class"], refund["price"]) == (0, "irreversible", "19.99")
    assert (refund["price_text"], refund["mode"]) == ("19.99 USD", "enforce")


@pytest.mark.parametrize(
    ("policy", "args", "status", "reason"),
    [
        pytest.param(
            PROCUREMENT,
            ["--route", "supplier POST /invoices", "--body", "{}"],
            403,
            "unknown_route",
            id="unknown-route",
        ),
        pytest.param(
            PROCUREMENT,
            ["--route", "supplier POST /orders", "--body", json.dumps({**ORDER, "quantity": -1})],
            422,
            "bad_amount",
            id="bad-amount",
        ),
        pytest.param(
            PROCUREMENT,
            ["--route", "supplier POST /orders", "--body", '{"sku": 1, "sku": 2}'],
            400,
            "bad_json",
            id="bad-json",
        ),
        pytest.param(
            PROCUREMENT,
            [
                "--route",
                "supplier POST /orders",
                "--agent",
                "buyer-01",
                "--body",
                json.dumps({**ORDER, "quantity": 100_000}),
            ],
            403,
            "per_effect_cap",
            id="per-effect-cap",
        ),
        pytest.param(
            PAYMENTS,
            [
                "--route",
                "payments POST /v1/refunds",
                "--form",
                "--agent",
                "checkout-01",
                "--body",
                "charge=ch_1&amount=1999",
            ],
            403,
            "route_not_allowed",
            id="route-not-allowed",
        ),
        pytest.param(
            PAYMENTS,
            ["--route", "payments POST /v1/refunds", "--body", '{"charge": "c", "amount": 1}'],
            415,
            "unsupported_media_type",
            id="json-for-a-form-route",
        ),
    ],
)
def test_price_names_the_reason_the_gateway_would_refuse(
    policy: Path, args: list[str], status: int, reason: str
) -> None:
    code, quote = price(policy, *args)
    assert code == 1
    assert (quote["refused"]["status"], quote["refused"]["reason"]) == (status, reason)
    words = irrev("policy", "price", policy, *args)
    assert words.returncode == 1
    assert f"refused:      {status} {reason}: " in words.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--route", "supplier POST"], "must be 'TOOL METHOD PATH'"),
        (["--tool", "supplier", "--path", "/orders"], "--tool needs --method and --path"),
        (["--route", "supplier GET /catalog", "--agent", "nobody"], "'nobody' is not an agent"),
        (["--route", "supplier POST /orders", "--body", "@nope.json"], "nope.json: no such file"),
    ],
)
def test_price_usage_errors_are_one_line(args: list[str], message: str) -> None:
    result = irrev("policy", "price", PROCUREMENT, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
