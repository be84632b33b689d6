"""MCP routes in the catalog: `CALL <server>/<tool>` on a tool with `mcp:` (or
`mcp_command:`, a stdio server), priced from the call's `arguments` like a JSON body;
unknown MCP tools fail closed; what the validator refuses (examples/mcp-fleet.yaml is
the complete example)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pricing import PolicyError, load_policy_data, price_request
from pricing.errors import BadAmount, UnknownRoute
from pricing.policy import BodyFormat, EffectClass, McpErrorMeaning

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp-fleet.yaml"
ORDER = {"supplier_id": "Acme", "sku": "bolts", "quantity": 10, "unit_price": "100"}


def fleet(**replaced: Any) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    data.update(replaced)
    return data


def problems_of(data: dict[str, Any]) -> str:
    with pytest.raises(PolicyError) as caught:
        load_policy_data(data, "test")
    return str(caught.value)


def test_a_call_is_priced_from_its_arguments() -> None:
    policy = load_policy_data(fleet(), "fleet")
    effect = price_request(policy, "procure", "CALL", "/place_order", {}, ORDER, BodyFormat.JSON)
    assert effect.effect_class is EffectClass.COMPENSABLE
    assert effect.face_value_micros == 1000 * 10**6
    assert 0 < effect.price_micros < effect.face_value_micros  # quantile of the residual
    assert effect.risk_factors == ("supplier:acme",)
    assert effect.route_id == "procure CALL /place_order"
    deletion = price_request(
        policy, "github", "CALL", "/delete_repository", {}, {"owner": "o", "repo": "r"}
    )
    assert deletion.price_micros == deletion.face_value_micros == 5000 * 10**6
    assert deletion.needs_approval


def test_bad_arguments_name_the_field() -> None:
    policy = load_policy_data(fleet(), "fleet")
    for bad in ("NaN", "1e999", -1, True, [1], {"a": 1}):
        with pytest.raises(BadAmount):
            price_request(policy, "procure", "CALL", "/place_order", {}, {**ORDER, "quantity": bad})


def test_unknown_mcp_tools_fail_closed_even_where_unknown_routes_are_priced() -> None:
    policy = load_policy_data(
        fleet(unknown_routes={"action": "price_as_irreversible", "face_value": "amount"}),
        "fleet",
    )
    # find_effect is a tool of the server, but no route prices it.
    for tool in ("/find_effect", "/drop_database"):
        with pytest.raises(UnknownRoute, match="unknown MCP tools are refused"):
            price_request(policy, "procure", "CALL", tool, {}, {"amount": "1"})
    with pytest.raises(UnknownRoute):
        price_request(policy, "other-tenants-server", "CALL", "/place_order", {}, ORDER)
    # The HTTP methods never reach an MCP server's tools.
    with pytest.raises(UnknownRoute):
        price_request(policy, "procure", "POST", "/place_order", {}, ORDER)


def test_is_error_meaning_is_per_route() -> None:
    policy = load_policy_data(fleet(), "fleet")
    meanings = {route.route: route.is_error for route in policy.document.routes}
    assert meanings["CALL procure/reject_order"] is McpErrorMeaning.NOT_EXECUTED
    assert meanings["CALL procure/flaky_order"] is None  # ambiguous


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            lambda d: d["routes"][0].update(route="CALL github/place_order"),
            "names server 'github', but the route's tool is 'procure'",
            id="server-mismatch",
        ),
        pytest.param(
            lambda d: d["routes"][0].update(route="POST /orders"),
            "is an MCP server: its routes are 'CALL procure/<tool name>'",
            id="http-route-on-mcp",
        ),
        pytest.param(
            lambda d: d["tools"].update(procure={"upstream": "http://127.0.0.1:1"}),
            "CALL routes name an MCP server",
            id="call-on-http-tool",
        ),
        pytest.param(
            lambda d: d["tools"]["procure"].update(upstream="http://127.0.0.1:1"),
            "give one of upstream (an HTTP API), mcp (an MCP server's URL) or mcp_command",
            id="both",
        ),
        pytest.param(
            lambda d: d["tools"]["procure"].update(mcp_command=["mcp-procure"]),
            "give one of upstream (an HTTP API), mcp (an MCP server's URL) or mcp_command",
            id="url-and-command",
        ),
        pytest.param(
            lambda d: d["tools"].update(procure={"mcp_command": []}),
            "tools.procure.mcp_command: List should have at least 1 item",
            id="empty-command",
        ),
        pytest.param(
            lambda d: d["tools"].update(procure={"mcp_command": ["mcp-procure", "a\x00b"]}),
            "tools.procure.mcp_command[1]: 'a\\x00b' has the wrong form",
            id="nul-in-argument",
        ),
        pytest.param(
            lambda d: d["tools"]["procure"].update(mcp_env={"TOKEN": {"env": "T"}}),
            "tools.procure.mcp_env: mcp_env is for a stdio MCP server: set mcp_command too",
            id="env-without-command",
        ),
        pytest.param(
            lambda d: d["tools"].update(procure={"mcp_command": ["s"], "mcp_cwd": "relative"}),
            "tools.procure.mcp_cwd",
            id="relative-cwd",
        ),
        pytest.param(
            lambda d: d["tools"].update(
                procure={"mcp_command": ["s"], "mcp_env": {"T": {"env": "IRREV_ADMIN_TOKENS"}}}
            ),
            "tools.procure.mcp_env.T: IRREV_* variables are the gateway's own settings",
            id="env-from-irrev-setting",
        ),
        pytest.param(
            lambda d: d["tools"].update(
                procure={"mcp_command": ["s"], "credentials": {"Authorization": {"env": "T"}}}
            ),
            "a stdio MCP server gets no HTTP headers: give its secrets as mcp_env entries",
            id="headers-on-stdio",
        ),
        pytest.param(
            lambda d: d["routes"][0].update(route="CALL procure/../x"),
            "must be 'CALL <server>/<tool>'",
            id="bad-tool-name",
        ),
        pytest.param(
            lambda d: d["routes"][0].update(query=["sku"]),
            "MCP tools take JSON arguments only",
            id="query",
        ),
        pytest.param(
            lambda d: d["routes"][0].update(lookup="CALL github/find_effect"),
            "an MCP route's lookup is a tool of the same server",
            id="lookup-elsewhere",
        ),
        pytest.param(
            lambda d: d["tools"].update({"a__b": {"mcp": "http://127.0.0.1:1/mcp"}}),
            "an MCP server's name must not contain '__'",
            id="separator-in-name",
        ),
    ],
)
def test_the_validator_names_what_is_wrong(change: Any, message: str) -> None:
    data = fleet()
    change(data)
    assert message in problems_of(data)


def test_is_error_only_on_call_routes() -> None:
    data = fleet(
        tools={"shop": {"upstream": "http://127.0.0.1:1"}},
        routes=[
            {
                "tool": "shop",
                "route": "POST /orders",
                "class": "irreversible",
                "body": ["amount"],
                "face_value": "amount",
                "is_error": "not_executed",
            }
        ],
    )
    data["agents"]["dev-01"].pop("routes")
    assert "only CALL routes (MCP tools) take is_error" in problems_of(data)


def test_a_stdio_server_is_an_mcp_server_of_the_catalog() -> None:
    tools = {
        "procure": {
            "mcp_command": ["python", "-m", "procure_mcp"],
            "mcp_env": {"LOG_LEVEL": "debug", "PROCURE_TOKEN": {"file": "/run/secrets/procure"}},
            "mcp_cwd": "/srv/procure",
            "dedupes": True,
        },
        "github": {"mcp": "http://127.0.0.1:8911/mcp"},
    }
    policy = load_policy_data(fleet(tools=tools), "fleet")
    assert policy.catalog.mcp_tools == {"procure", "github"}
    effect = price_request(policy, "procure", "CALL", "/place_order", {}, ORDER, BodyFormat.JSON)
    assert effect.route_id == "procure CALL /place_order"
