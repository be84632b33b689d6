"""The policy fields of the trust boundary: tool credentials and header allow-lists,
in-progress statuses, route scopes and tenant admins are checked when a policy is
loaded, each problem naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.state.credentials import resolve_credentials, webhook_secret
from pricing import (
    PolicyError,
    RouteNotAllowed,
    agent_for_token_hash,
    check_route_scope,
    load_policy_data,
    price_request,
)
from tests.policy.base import HASH_A, HASH_B, base
from tests.policy.test_malformed import Mutation, set_path

SHOP = ("tools", "shop")
CASES: list[Any] = [
    pytest.param(
        set_path(*SHOP, "credentials", value={"Authorization": {}}),
        "tools.shop.credentials.Authorization",
        "exactly one of env",
        id="credential-without-source",
    ),
    pytest.param(
        set_path(*SHOP, "credentials", value={"X-Key": {"env": "A", "file": "/run/x"}}),
        "tools.shop.credentials.X-Key",
        "exactly one of env",
        id="credential-with-two-sources",
    ),
    pytest.param(
        set_path(*SHOP, "credentials", value={"X-Key": {"env": "IRREV_ADMIN_TOKENS"}}),
        "tools.shop.credentials.X-Key",
        "IRREV_",
        id="credential-from-gateway-settings",
    ),
    pytest.param(
        set_path(*SHOP, "credentials", value={"X-Key": {"file": "relative/path"}}),
        "tools.shop.credentials.X-Key.file",
        "wrong form",
        id="credential-file-not-absolute",
    ),
    pytest.param(
        set_path("webhook", value={"url": "https://hooks.example.com/x", "secret": {}}),
        "webhook.secret",
        "exactly one of env",
        id="webhook-secret-without-source",
    ),
    pytest.param(
        set_path("webhook", value={"url": "https://h.example/x", "secret": {"env": "IRREV_X"}}),
        "webhook.secret",
        "IRREV_",
        id="webhook-secret-from-gateway-settings",
    ),
    pytest.param(
        set_path("webhook", value={"url": "ftp://h.example/x", "secret": {"env": "S"}}),
        "webhook.url",
        "",
        id="webhook-url-not-http",
    ),
    pytest.param(
        set_path(*SHOP, "credentials", value={"Content-Length": {"env": "A"}}),
        "tools.shop.credentials.Content-Length",
        "not allowed",
        id="credential-framing-header",
    ),
    pytest.param(
        set_path(*SHOP, "credentials", value={"A": {"env": "X"}, "a": {"env": "Y"}}),
        "tools.shop.credentials.a",
        "named twice",
        id="credential-twice",
    ),
    pytest.param(
        set_path(*SHOP, "forward_headers", value=["Stripe-Version", "X-HTTP-Method-Override"]),
        "tools.shop.forward_headers[1]",
        "not allowed",
        id="forward-method-override",
    ),
    pytest.param(
        set_path(*SHOP, "forward_headers", value=["X_HTTP_Method_Override"]),
        "tools.shop.forward_headers[0]",
        "not allowed",
        id="forward-method-override-underscores",
    ),
    pytest.param(
        set_path(*SHOP, "forward_headers", value=["connection"]),
        "tools.shop.forward_headers[0]",
        "not allowed",
        id="forward-hop-by-hop",
    ),
    pytest.param(
        set_path(*SHOP, "forward_headers", value=["X-Irrev-Hold"]),
        "tools.shop.forward_headers[0]",
        "not allowed",
        id="forward-gateway-header",
    ),
    pytest.param(
        set_path(*SHOP, "response_headers", value=["set-cookie"]),
        "tools.shop.response_headers[0]",
        "not allowed",
        id="return-set-cookie",
    ),
    pytest.param(
        set_path(*SHOP, "forward_headers", value=["bad header"]),
        "tools.shop.forward_headers[0]",
        "wrong form",
        id="header-not-a-token",
    ),
    pytest.param(
        set_path(*SHOP, "in_progress_statuses", value=[409, 503]),
        "tools.shop.in_progress_statuses[1]",
        "less than or equal to 499",
        id="in-progress-not-4xx",
    ),
    pytest.param(
        set_path("agents", "a1", "routes", value=["shop POST /nowhere"]),
        "agents.a1.routes[0]",
        "not a route of the catalog",
        id="scope-unknown-route",
    ),
    pytest.param(
        set_path("accounts", "principals", "ops", "routes", value=["other *"]),
        "accounts.principals.ops.routes[0]",
        "is not defined",
        id="scope-unknown-tool",
    ),
    pytest.param(
        set_path("agents", "a1", "routes", value=["shop"]),
        "agents.a1.routes[0]",
        "must be '<tool> <METHOD> <path>'",
        id="scope-malformed",
    ),
    pytest.param(
        set_path("admins", value={"boss": {"token_sha256": HASH_A, "role": "viewer"}}),
        "admins.boss.token_sha256",
        "same token hash as agent 'a1'",
        id="admin-shares-agent-token",
    ),
    pytest.param(
        set_path("admins", value={"boss": {"token_sha256": "sha256:" + "c" * 64, "role": "root"}}),
        "admins.boss.role",
        "viewer",
        id="admin-unknown-role",
    ),
]


@pytest.mark.parametrize(("mutate", "path", "message"), CASES)
def test_trust_fields_are_checked(mutate: Mutation, path: str, message: str) -> None:
    doc = base()
    mutate(doc)
    with pytest.raises(PolicyError) as caught:
        load_policy_data(doc, "p.yaml")
    assert any(p.path == path and message in p.message for p in caught.value.findings), [
        str(p) for p in caught.value.findings
    ]


def test_route_scopes_need_both_agent_and_principal() -> None:
    doc = base()
    doc["agents"]["a1"]["routes"] = ["shop POST /orders", "shop GET /orders/{order}"]
    doc["accounts"]["principals"]["ops"]["routes"] = ["shop *"]
    doc["agents"]["a2"]["routes"] = []
    policy = load_policy_data(doc, "p.yaml")
    body = {"supplier_id": "s1", "quantity": 1, "unit_price": "1"}
    order = price_request(policy, "shop", "POST", "/orders", {}, body)
    refund = price_request(policy, "shop", "POST", "/orders/7/refund", {}, {"amount": "1"})
    a1 = agent_for_token_hash(policy, HASH_A)
    a2 = agent_for_token_hash(policy, HASH_B)
    assert a1 is not None and a2 is not None
    check_route_scope(policy, a1, order)
    with pytest.raises(RouteNotAllowed):
        check_route_scope(policy, a1, refund)
    with pytest.raises(RouteNotAllowed):
        check_route_scope(policy, a2, order)
    doc["accounts"]["principals"]["ops"]["routes"] = ["shop POST /orders/{id}/refund"]
    narrowed = load_policy_data(doc, "p.yaml")
    with pytest.raises(RouteNotAllowed):
        check_route_scope(narrowed, a1, order)


def test_defaults_pass_trace_context_only_and_treat_409_as_in_progress() -> None:
    """Not the agent's Accept: an upstream can answer it 406 after the effect."""
    policy = load_policy_data(base(), "p.yaml")
    tool = policy.document.tools["shop"]
    assert policy.catalog.forwarded_headers["shop"] == {"traceparent", "tracestate"}
    assert tool.in_progress_statuses == [409]


def test_a_webhook_secret_is_read_at_load_and_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    doc = base()
    doc["webhook"] = {"url": "https://hooks.example.com/irrev", "secret": {"env": "HOOK_SECRET"}}
    policy = load_policy_data(doc, "p.yaml")
    monkeypatch.delenv("HOOK_SECRET", raising=False)
    with pytest.raises(PolicyError) as caught:
        resolve_credentials(policy)
    assert "'HOOK_SECRET' is not set" in str(caught.value)
    monkeypatch.setenv("HOOK_SECRET", "whsec-very-secret-value")
    resolve_credentials(policy)
    assert webhook_secret(policy) == b"whsec-very-secret-value"
    assert "whsec" not in policy.document.model_dump_json()


def test_a_stdio_servers_environment_takes_the_gateways_secrets_and_never_shows_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("from-a-file\n")
    doc = base()
    doc["tools"]["shop"] = {
        "mcp_command": ["shop-mcp", "--stdio"],
        "mcp_env": {
            "SHOP_TOKEN": {"env": "SHOP_TOKEN_FOR_IRREV"},
            "SHOP_KEY": {"file": str(secret_file)},
            "SHOP_REGION": "eu-west-1",
        },
    }
    doc["routes"] = []
    policy = load_policy_data(doc, "p.yaml")
    monkeypatch.delenv("SHOP_TOKEN_FOR_IRREV", raising=False)
    with pytest.raises(PolicyError) as caught:
        resolve_credentials(policy)
    assert (
        "tools.shop.mcp_env.SHOP_TOKEN: environment variable 'SHOP_TOKEN_FOR_IRREV' is not set"
        in str(caught.value)
    )
    # Any text but NUL may be a variable's value (not only what a header can carry).
    monkeypatch.setenv("SHOP_TOKEN_FOR_IRREV", "tok en/é")
    assert dict(resolve_credentials(policy)["shop"]) == {
        "SHOP_TOKEN": "tok en/é",
        "SHOP_KEY": "from-a-file",
        "SHOP_REGION": "eu-west-1",
    }
    assert "tok en" not in policy.document.model_dump_json()
