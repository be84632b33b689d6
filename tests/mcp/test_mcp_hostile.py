"""Hostile `arguments` and names: wrong types, NaN, huge numbers, deep nesting,
duplicate keys, unknown tools, another tenant's server, no token. Each gets a clear
error (a refusal result with its reason, or HTTP 400/401 problem+json before the SDK
reads the message) and nothing is debited or called."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml
from mcp.shared.exceptions import MCPError

from gateway.edge.advice import next_step
from tests.gateway.helpers import (
    assert_mcp_refusal,
    assert_problem,
    balances,
    based,
    trickled_request,
    used,
)

from .conftest import McpGateway, agent, key, order, structured, text_of, tool_stats

pytestmark = pytest.mark.asyncio(loop_scope="session")
MODERN = "2026-07-28"


def deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"x": 1}
    for _ in range(levels):
        node = {"x": node}
    return node


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("procure__place_order", {**order(), "quantity": "ten"}, "bad_amount"),
        ("procure__place_order", {**order(), "quantity": True}, "bad_amount"),
        ("procure__place_order", {**order(), "unit_price": 10**400}, "bad_amount"),
        ("procure__place_order", {**order(), "unit_price": "1e9"}, "bad_amount"),
        # Arabic-Indic digits: int() and \d read them as 123, a price is ASCII.
        ("procure__place_order", {**order(), "unit_price": "\u0661\u0662\u0663"}, "bad_amount"),
        ("procure__place_order", {**order(), "quantity": -5}, "bad_amount"),
        ("procure__place_order", {**order(), "quantity": 2**60}, "bad_amount"),
        ("procure__place_order", {**order(), "quantity": 10**6}, "per_effect_cap"),
        ("procure__place_order", {**order(), "supplier_id": {"$ne": 1}}, "bad_risk_factor"),
        # One supplier to a parser that reads numbers as doubles; two accounts here.
        ("procure__place_order", {**order(), "supplier_id": 2**60 + 1}, "bad_risk_factor"),
        ("procure__place_order", {"sku": "bolts"}, "bad_amount"),
        # An argument the route does not list would reach the server unpriced.
        ("procure__place_order", {**order(), "express": True}, "undeclared_field"),
        ("procure__find_effect", {"idempotency_key": "x"}, "unknown_route"),
        ("procure__drop_tables", {}, "unknown_route"),
        ("vault__place_order", order(), "unknown_route"),
        ("place_order", order(), "unknown_route"),
        ("procure__", order(), "unknown_route"),
    ],
)
async def test_hostile_calls_are_refused_with_a_reason_and_debit_nothing(
    name: str,
    arguments: dict[str, Any],
    reason: str,
    mcp_gateway: McpGateway,
    tools_http: httpx.AsyncClient,
    http: httpx.AsyncClient,
) -> None:
    tenant = mcp_gateway.tenant("hostile")
    admin = mcp_gateway.gateway.admin
    before = used(await balances(http, admin, tenant))
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        result = await client.call_tool(name, arguments, meta=key())
    assert result.is_error
    assert structured(result)["reason"] == reason, result
    # The code is for programs (structuredContent); the text is for the model.
    assert text_of(result.content[0]).startswith("irrev did not make this call: ")
    assert reason not in text_of(result.content[0])
    assert used(await balances(http, admin, tenant)) == before
    assert (await tool_stats(tools_http, tenant))["calls"] == 0
    other = mcp_gateway.tenant("hostile-other")
    assert (await tool_stats(tools_http, other))["calls"] == 0


def call_message(arguments_json: str) -> bytes:
    return (
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"procure__place_order",'
        f'"arguments":{arguments_json},"_meta":{{"io.modelcontextprotocol/protocolVersion":'
        f'"{MODERN}","io.modelcontextprotocol/clientInfo":{{"name":"raw","version":"1"}},'
        '"io.modelcontextprotocol/clientCapabilities":{}}}}'
    ).encode()


@pytest.mark.parametrize(
    "arguments_json",
    [
        '{"supplier_id":"s1","sku":"b","quantity":NaN,"unit_price":"1"}',
        '{"supplier_id":"s1","sku":"b","quantity":1,"quantity":100000,"unit_price":"1"}',
        '{"supplier_id":"s1","sku":"b","quantity":1,"Quantity":100000,"unit_price":"1"}',
        json.dumps({**order(), "note": deep(40)}),
        '{"supplier_id":"s1","sku":"b","quantity":1,"unit_price":0.99999999999999999999}',
        '{"supplier_id":"s1","sku":"b","quantity":1,"unit_price":1e400}',
        # The SDK cannot encode an unpaired surrogate to send it: the call was reserved,
        # never sent, and left ambiguous and charged.
        '{"supplier_id":"s1","sku":"\\ud800","quantity":1,"unit_price":"1"}',
    ],
    ids=[
        "nan",
        "duplicate-key",
        "keys-differing-in-case",
        "deep",
        "beyond-double",
        "inf",
        "lone-surrogate",
    ],
)
async def test_malformed_json_is_refused_before_the_sdk_reads_it(
    arguments_json: str,
    mcp_gateway: McpGateway,
    tools_http: httpx.AsyncClient,
    http: httpx.AsyncClient,
) -> None:
    tenant = mcp_gateway.tenant("hostile")
    before = used(await balances(http, mcp_gateway.gateway.admin, tenant))
    response = await http.post(
        "/mcp",
        content=call_message(arguments_json),
        headers={
            **tenant.auth("buyer-01"),
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
        },
    )
    assert_mcp_refusal(response, 400, "bad_json")
    assert used(await balances(http, mcp_gateway.gateway.admin, tenant)) == before
    assert (await tool_stats(tools_http, tenant))["calls"] == 0


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"note": "x" * (70 * 1024)}, "body_too_complex"),
        ({"SKU": "c"}, "bad_json"),
    ],
    ids=["string-too-long", "keys-differing-in-case"],
)
async def test_a_refusal_before_the_sdk_reaches_the_host_in_irrevs_words(
    extra: dict[str, Any], reason: str, mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """Refused before the SDK reads the POST, a call reached the host as "Server
    returned an error response" (-32603): the SDK's client reads a non-2xx body only
    as a JSON-RPC error in application/json, never problem+json."""
    tenant = mcp_gateway.tenant("hostile")
    async with agent(mcp_gateway.url, tenant.auth("buyer-02")) as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("procure__place_order", {**order(), **extra})
    error = raised.value.error
    assert error.message.startswith("irrev did not make this call: "), error
    assert error.message.endswith(next_step(reason)[1]), error
    assert isinstance(error.data, dict) and error.data["reason"] == reason, error
    assert error.data["retry"] == "fix", error
    assert (await tool_stats(tools_http, tenant))["calls"] == 0


async def test_no_token_no_tools(mcp_gateway: McpGateway, http: httpx.AsyncClient) -> None:
    response = await http.post("/mcp", content=call_message(json.dumps(order())))
    assert_mcp_refusal(response, 401, "unauthenticated")
    other = mcp_gateway.tenant("hostile-other")
    # Another tenant's agent sees its own servers only.
    async with agent(mcp_gateway.url, other.auth("buyer-01")) as client:
        names = {tool.name.partition("__")[0] for tool in (await client.list_tools()).tools}
    assert names == {"vault", "github"}


async def test_an_http_tool_is_not_reached_through_mcp(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """`web__anything` would go to the tenant's HTTP tool as method CALL, path
    /anything, priced as an unknown route and charged."""
    tenant = mcp_gateway.tenant("mixed")
    admin = mcp_gateway.gateway.admin
    before = used(await balances(http, admin, tenant))
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        result = await client.call_tool("web__anything", {"amount": 1}, meta=key())
    assert result.is_error
    assert structured(result)["reason"] == "unknown_route", result
    assert used(await balances(http, admin, tenant)) == before


async def test_no_event_stream_is_held_open(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """A GET stream would carry nothing (the endpoint is stateless) and never end: each
    would hold a worker's file descriptor for as long as the agent liked."""
    tenant = mcp_gateway.tenant("hostile")
    response = await http.get(
        "/mcp",
        headers={**tenant.auth("buyer-01"), "Accept": "text/event-stream"},
        timeout=10.0,
    )
    assert_problem(response, 405, "method_not_allowed")


@pytest.mark.parametrize("bad_key", ["", "a b", "ключ", "k" * 256, 42])
async def test_a_bad_idempotency_key_is_refused(
    bad_key: object, mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("hostile")
    async with agent(mcp_gateway.url, tenant.auth("buyer-02")) as client:
        result = await client.call_tool("procure__place_order", order(), meta=key(bad_key))
    assert result.is_error
    assert structured(result)["reason"] == "bad_idempotency_key"
    assert (await tool_stats(tools_http, tenant))["calls"] == 0


async def test_a_tenants_policy_admin_cannot_repoint_its_mcp_server(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """Where calls go (with the gateway's credentials for the server) is the
    operator's: a tenant's policy_admin changing `mcp` is refused, as `upstream` is, and
    so is making the server a stdio command (it would run on the gateway's hosts).
    So is `dedupes` (issue 26): declared by a policy_admin for a server that does not
    deduplicate, one ambiguous call was sent again on every repeat, 6 times for one
    charge. Writing down what is in force (`dedupes: false`) is no change."""
    tenant = mcp_gateway.tenant("upload")
    policy_dir = mcp_gateway.gateway.policy_dir
    before = (policy_dir / f"{tenant.id}.yaml").read_text()
    url = f"/v1/admin/tenants/{tenant.id}/policy"
    same = await http.put(
        url, content=before.encode(), headers=await based(http, tenant.id, tenant.admin_auth)
    )
    assert same.status_code == 200, same.text  # the role may upload its policy
    data = yaml.safe_load(before)
    assert not data["tools"]["procure"].get("dedupes", False)
    data["tools"]["procure"]["dedupes"] = False
    applied = yaml.safe_dump(data)
    headers = await based(http, tenant.id, tenant.admin_auth)
    spelled = await http.put(url, content=applied.encode(), headers=headers)
    assert spelled.status_code == 200, spelled.text
    stdio = {"mcp_command": ["/bin/sh", "-c", "cat /etc/passwd"]}
    for tool, fields in (
        ({"dedupes": True}, ["dedupes"]),
        ({"mcp": "http://127.0.0.1:9/elsewhere/mcp"}, ["mcp"]),
        ({"mcp": None, **stdio}, ["mcp", "mcp_command"]),
    ):
        changed = yaml.safe_load(applied)
        procure = {**changed["tools"]["procure"], **tool}
        changed["tools"]["procure"] = {k: v for k, v in procure.items() if v is not None}
        text = yaml.safe_dump(changed).encode()
        headers = await based(http, tenant.id, tenant.admin_auth)
        refused = await http.put(url, content=text, headers=headers)
        body = assert_problem(refused, 403, "operator_only")
        assert body["fields"] == [f"tools.procure.{field}" for field in fields], body
        assert (policy_dir / f"{tenant.id}.yaml").read_text() == before


async def test_a_session_id_and_request_id_name_an_effect_of_one_agent_only(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """Without a `_meta` key a call is keyed by its content, and that key names an
    effect of the authenticated agent only: another agent sending the same message
    (its Mcp-Session-Id and JSON-RPC id too) makes its own effect and never gets the
    first one's result; the same agent repeating it gets its own recorded result."""
    tenant = mcp_gateway.tenant("hostile")
    message = call_message(json.dumps(order(quantity=1)))

    async def post(agent_name: str) -> dict[str, Any]:
        response = await http.post(
            "/mcp",
            content=message,
            headers={
                **tenant.auth(agent_name),
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": MODERN,
                "Mcp-Method": "tools/call",
                "Mcp-Name": "procure__place_order",
                "Mcp-Session-Id": "chosen-by-the-client",
            },
        )
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        assert not result.get("isError"), result
        return result

    calls = (await tool_stats(tools_http, tenant))["calls"]
    mine, theirs = await post("buyer-01"), await post("buyer-02")
    assert mine["_meta"]["dev.irrev/hold"] != theirs["_meta"]["dev.irrev/hold"]
    assert mine["structuredContent"]["effect"] != theirs["structuredContent"]["effect"]
    again = await post("buyer-01")
    assert again["structuredContent"] == mine["structuredContent"]
    assert (await tool_stats(tools_http, tenant))["calls"] == calls + 2


async def test_a_trickled_mcp_body_is_cut_off_and_calls_nothing(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """A slow loris on POST /mcp: 408 body_timeout, before the SDK or the ledger."""
    tenant = mcp_gateway.tenant("hostile")
    before = used(await balances(http, mcp_gateway.gateway.admin, tenant))
    calls = (await tool_stats(tools_http, tenant))["calls"]
    headers = {
        **tenant.auth("buyer-01"),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
    }
    message = call_message(json.dumps(order(quantity=1)))
    status, problem = await trickled_request(mcp_gateway.url, "/mcp", headers, message)
    assert (status, problem["reason"]) == (408, "body_timeout")
    assert used(await balances(http, mcp_gateway.gateway.admin, tenant)) == before
    assert (await tool_stats(tools_http, tenant))["calls"] == calls
