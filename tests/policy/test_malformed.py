"""Every kind of malformed policy is refused with a message naming the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pricing import PolicyError, load_policy_data, load_policy_text
from tests.policy.base import HASH_A, base, base_yaml

Mutation = Callable[[dict[str, Any]], None]


def set_path(*path: str | int, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def delete(*path: str | int) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


def add_route(**route: Any) -> Mutation:
    return lambda doc: doc["routes"].append(route)


CASES: list[Any] = [
    pytest.param(
        set_path("tools", "shop", "settler_token_sha256", value=HASH_A),
        "tools.shop.settler_token_sha256",
        "same token hash as agent 'a1'",
        id="settler-token-of-an-agent",
    ),
    pytest.param(
        set_path("tools", "shop", "settler_token_sha256", value="sha256:short"),
        "tools.shop.settler_token_sha256",
        "should match pattern",
        id="settler-token-not-a-hash",
    ),
    pytest.param(
        set_path("routes", 1, "overrun_report", value=True),
        "routes[1].overrun_report",
        "only agents of in-process routes",
        id="overrun-report-on-a-proxied-route",
    ),
    pytest.param(
        set_path("accounts", "tenant", "limit", value="lots"),
        "accounts.tenant.limit",
        "not a plain non-negative decimal",
        id="limit-not-a-number",
    ),
    pytest.param(
        set_path("accounts", "principals", "ops", "limit", value=-5),
        "accounts.principals.ops.limit",
        "negative",
        id="negative-limit",
    ),
    pytest.param(
        set_path("agents", "a1", "window_cap", value="0.0000001"),
        "agents.a1.window_cap",
        "not exact in minor units",
        id="amount-below-one-micro",
    ),
    pytest.param(
        set_path("accounts", "tenant", "limit", value=True),
        "accounts.tenant.limit",
        "boolean",
        id="bool-limit",
    ),
    pytest.param(
        set_path("accounts", "tenant", "limit", value="9007199255"),
        "accounts.tenant.limit",
        "maximum",
        id="limit-above-2-53-micros",
    ),
    pytest.param(
        set_path("agents", "a1", "principal", value="sales"),
        "agents.a1.principal",
        "principal 'sales' is not defined",
        id="agent-for-unknown-principal",
    ),
    pytest.param(
        set_path("agents", "a2", "token_sha256", value=HASH_A),
        "agents.a2.token_sha256",
        "same token hash as agent 'a1'",
        id="shared-token",
    ),
    pytest.param(
        set_path("agents", "a1", "token_sha256", value="hunter2"),
        "agents.a1.token_sha256",
        "wrong form",
        id="plaintext-token",
    ),
    pytest.param(
        add_route(tool="shop", route="GET /orders/{order_id}", **{"class": "read"}),
        "routes[3].route",
        "duplicate route",
        id="duplicate-route",
    ),
    pytest.param(
        set_path("routes", 1, "face_value", value="quantity * unit_cost"),
        "routes[1].face_value",
        "field 'unit_cost' is not declared",
        id="face-value-names-missing-field",
    ),
    pytest.param(
        set_path("routes", 1, "face_value", value="__import__('os').system('x')"),
        "routes[1].face_value",
        "is not a field name",
        id="face-value-is-code",
    ),
    pytest.param(
        set_path("routes", 1, "class", value="refundable"),
        "routes[1].class",
        "'read', 'reversible', 'compensable' or 'irreversible'",
        id="unknown-effect-class",
    ),
    pytest.param(
        set_path("routes", 1, "pricing", value={"model": "magic"}),
        "routes[1].pricing",
        "'face', 'expected', 'quantile', 'stressed'",
        id="unknown-pricing-model",
    ),
    pytest.param(
        set_path("routes", 1, "pricing", "level", value=1.5),
        "routes[1].pricing.level",
        "less than 1",
        id="quantile-level-out-of-range",
    ),
    pytest.param(
        set_path(
            "routes", 2, "pricing", value={"model": "expected", "recovery": {"alpha": 1, "beta": 1}}
        ),
        "routes[2].pricing.model",
        "irreversible effects cannot be compensated",
        id="irreversible-priced-below-face",
    ),
    pytest.param(
        set_path("routes", 1, "risk_factors", value=["region:{supplier_id}"]),
        "routes[1].risk_factors[0]",
        "no accounts.risk_factors pattern caps",
        id="uncapped-risk-factor",
    ),
    pytest.param(
        set_path("routes", 1, "tool", value="bank"),
        "routes[1].tool",
        "tool 'bank' is not defined",
        id="route-for-unknown-tool",
    ),
    pytest.param(
        set_path("routes", 1, "route", value="FETCH /orders"),
        "routes[1].route",
        "method must be one of",
        id="bad-method",
    ),
    pytest.param(
        set_path("routes", 1, "lookup", value="GET /orders/{order}"),
        "routes[1].lookup",
        "{key}",
        id="lookup-without-key",
    ),
    pytest.param(
        delete("routes", 2, "face_value"),
        "routes[2].face_value",
        "needs exactly one of face_value",
        id="effect-route-without-face-value",
    ),
    pytest.param(
        set_path("routes", 0, "pricing", value={"model": "face"}),
        "routes[0].pricing",
        "read routes are free",
        id="priced-read-route",
    ),
    pytest.param(
        set_path("window", value=86400),
        "window",
        "with a unit",
        id="window-without-unit",
    ),
    pytest.param(
        set_path("soft_band", value=1.2),
        "soft_band",
        "less than or equal to 1",
        id="soft-band-above-one",
    ),
    pytest.param(
        set_path("risk_unit", "scale", value=1000_001),
        "risk_unit.scale",
        "power of ten",
        id="scale-not-power-of-ten",
    ),
    pytest.param(
        set_path("tools", "shop", "upstream", value="ftp://files"),
        "tools.shop.upstream",
        "http(s) base URL",
        id="bad-upstream",
    ),
    pytest.param(
        set_path("accounts", "tenant", "limt", value="5"),
        "accounts.tenant.limt",
        "unknown field",
        id="misspelt-key",
    ),
    pytest.param(delete("accounts"), "accounts", "missing", id="missing-accounts"),
    pytest.param(
        set_path("unknown_routes", value="price_as_irreversible"),
        "unknown_routes.face_value",
        "needs the body field",
        id="price-unknown-without-face-value",
    ),
    pytest.param(
        set_path("agents", "a1", "per_effect_cap", value="300"),
        "agents.a1.per_effect_cap",
        "above the agent's window_cap",
        id="per-effect-cap-above-window-cap",
    ),
    pytest.param(
        set_path("routes", 2, "amount_scale", value=3),
        "routes[2].amount_scale",
        "power of ten",
        id="amount-scale-not-a-power-of-ten",
    ),
    pytest.param(
        add_route(
            tool="shop",
            route="POST /fees",
            **{"class": "irreversible"},
            face_value_fixed="5",
            amount_scale=100,
        ),
        "routes[3].amount_scale",
        "face_value_fixed is already in the risk unit",
        id="amount-scale-with-fixed-face-value",
    ),
    pytest.param(
        set_path("routes", 2, "currency_field", value="currency"),
        "routes[2].currency_field",
        "'currency' is not declared",
        id="currency-field-undeclared",
    ),
    pytest.param(
        set_path("routes", 0, "currency_field", value="id"),
        "routes[0].currency_field",
        "read routes are free",
        id="currency-field-on-a-read",
    ),
    pytest.param(
        set_path("routes", 2, "body", value=["amount", "Amount"]),
        "routes[2].body",
        "differ only in case",
        id="fields-differing-in-case",
    ),
    pytest.param(
        set_path("routes", 2, "body_format", value="xml"),
        "routes[2].body_format",
        "'json' or 'form'",
        id="unknown-body-format",
    ),
    # An agent's allowance of kept answer bytes per day: a whole number of bytes.
    pytest.param(
        set_path("request_limits", value={"kept_answer_bytes": -1}),
        "request_limits.kept_answer_bytes",
        "greater than or equal to 0",
        id="kept-answer-bytes-negative",
    ),
    pytest.param(
        set_path("request_limits", value={"kept_answer_bytes": 1.5}),
        "request_limits.kept_answer_bytes",
        "valid integer",
        id="kept-answer-bytes-fraction",
    ),
    pytest.param(
        set_path("request_limits", value={"kept_answer_bytes": "16MiB"}),
        "request_limits.kept_answer_bytes",
        "valid integer",
        id="kept-answer-bytes-text",
    ),
    pytest.param(
        set_path("request_limits", value={"kept_answer_bytes": (1 << 40) + 1}),
        "request_limits.kept_answer_bytes",
        "less than or equal to 1099511627776",
        id="kept-answer-bytes-above-a-tebibyte",
    ),
]


@pytest.mark.parametrize(("mutate", "path", "message"), CASES)
def test_malformed_policy_names_the_field(mutate: Mutation, path: str, message: str) -> None:
    doc = base()
    mutate(doc)
    with pytest.raises(PolicyError) as info:
        load_policy_data(doc, "t1.yaml")
    paths = {p.path for p in info.value.findings}
    assert path in paths, info.value
    assert any(message in p.message for p in info.value.findings if p.path == path), info.value
    assert f"t1.yaml: {path}: " in str(info.value)


def test_at_least_ten_kinds_of_malformed_policy() -> None:
    assert len(CASES) >= 10


def test_base_policy_is_valid() -> None:
    policy = load_policy_text(base_yaml(), "t1.yaml")
    assert policy.tenant == "t1"
    assert policy.document.agents["a2"].per_effect_cap == 50_500_000


def test_every_problem_is_reported_at_once() -> None:
    doc = base()
    doc["agents"]["a1"]["principal"] = "nobody"
    doc["routes"][1]["face_value"] = "quantity * price"
    with pytest.raises(PolicyError) as info:
        load_policy_data(doc, "t1.yaml")
    assert {p.path for p in info.value.findings} >= {"agents.a1.principal", "routes[1].face_value"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("tenant: [unclosed", "not valid YAML", id="yaml-syntax"),
        pytest.param("- just\n- a list\n", "must be a YAML mapping", id="not-a-mapping"),
        pytest.param("tenant: a\ntenant: b\n", "duplicate key 'tenant'", id="duplicate-key"),
    ],
)
def test_unreadable_documents(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy_text(text, "x.yaml")


def test_duplicate_agent_key_in_yaml_is_refused() -> None:
    text = base_yaml().replace("  a2:\n", "  a1:\n", 1)
    with pytest.raises(PolicyError, match="duplicate key 'a1'"):
        load_policy_text(text, "x.yaml")


def test_an_agent_may_have_no_token_in_the_policy() -> None:
    """An agent whose credentials are managed keys only: it is an agent of the tenant
    (quotes, scopes, keys find it by id) that no policy token opens; two of them do
    not share a token."""
    data = base()
    del data["agents"]["a1"]["token_sha256"]
    data["agents"]["a3"] = {"principal": "ops", "per_effect_cap": "10", "window_cap": "20"}
    policy = load_policy_data(data, "keys-only")
    assert set(policy.agents_by_id) == {"a1", "a2", "a3"}
    assert [a.agent_id for a in policy.agents_by_hash.values()] == ["a2"]


def test_an_agents_kept_answer_bytes_default_to_16_mib_and_take_zero() -> None:
    doc = base()
    assert load_policy_data(doc, "t1.yaml").document.request_limits.kept_answer_bytes == 16 << 20
    doc["request_limits"] = {"kept_answer_bytes": 0}
    assert load_policy_data(doc, "t1.yaml").document.request_limits.kept_answer_bytes == 0
