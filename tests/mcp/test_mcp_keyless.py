"""Exactly-once for MCP hosts that send no key (issue 29): desktop and IDE hosts send no
`_meta`, and a model told "this waits for a human" asks again. Such a call is keyed by
its content, so repeats over any number of connections attach to the first call's
escalation, ambiguity or result, and a tool server that does not deduplicate is paid
once. A call that escalates waits for the decision (the route's `escalation_wait`),
and the person's reason reaches the model on every path."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

import httpx

from .conftest import McpGateway, McpTenant, agent, key, order, structured, text_of, tool_stats

DELETION_TOOL = "github__delete_repository"


def deletion() -> dict[str, Any]:
    """A repository no other test deletes (identical keyless calls are one call)."""
    return {"owner": "acme", "repo": f"legacy-{uuid.uuid4().hex[:8]}"}


async def queue(http: httpx.AsyncClient, tenant: McpTenant) -> set[str]:
    """The escalations waiting in the tenant's approval queue."""
    response = await http.get(
        f"/v1/admin/tenants/{tenant.id}/escalations",
        headers=tenant.admin_auth,
        params={"limit": 200},
    )
    assert response.status_code == 200, response.text
    return {item["escalation"] for item in response.json()["escalations"]}


async def arrived(http: httpx.AsyncClient, tenant: McpTenant, before: set[str]) -> set[str]:
    """The one escalation of the tenant's queue not in `before`, once it is there
    (within 10 s)."""
    deadline = asyncio.get_running_loop().time() + 10
    mine: set[str] = set()
    while not mine and asyncio.get_running_loop().time() < deadline:
        mine = await queue(http, tenant) - before
    assert len(mine) == 1
    return mine


async def decide(
    http: httpx.AsyncClient, tenant: McpTenant, escalation: str, verdict: str, reason: str
) -> None:
    response = await http.post(
        f"/v1/escalations/{escalation}/{verdict}",
        headers=tenant.admin_auth,
        json={"reason": reason},
    )
    assert response.status_code == 200, response.text


async def test_a_keyless_host_repeating_an_escalated_call_pays_once(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("keyless")
    target = deletion()
    before = await queue(http, tenant)
    results = []
    # Two connections, two calls each, no _meta: what a model repeating itself sends.
    async with (
        agent(mcp_gateway.url, tenant.auth("dev-01")) as first,
        agent(mcp_gateway.url, tenant.auth("dev-01")) as second,
    ):
        for client in (first, second, first, second):
            results.append(await client.call_tool(DELETION_TOOL, target))
    assert all(structured(r)["status"] == "escalated" for r in results)
    assert len({structured(r)["escalation"] for r in results}) == 1
    assert len({structured(r)["idempotency_key"] for r in results}) == 1
    text = text_of(results[0].content[0])
    said = "To get its result once a person decides, make the identical call again (the same"
    assert said in text, text
    assert "_meta" not in text  # the model is never asked for what its host cannot send
    waiting = await queue(http, tenant) - before
    assert len(waiting) == 1
    # The operator approves the whole queue.
    for escalation in waiting:
        await decide(http, tenant, escalation, "approve", "cleanup ticket OPS-7")
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        done = await client.call_tool(DELETION_TOOL, target)
    assert not done.is_error, done
    assert structured(done)["repo"] == target["repo"]
    said = " ".join(text_of(c) for c in done.content if c.type == "text")
    assert 'approved this call, saying: "cleanup ticket OPS-7"' in said, said
    assert done.meta is not None and done.meta["dev.irrev/note"] == "cleanup ticket OPS-7"
    stats = await tool_stats(tools_http, tenant)
    calls = [k for k, n in stats["calls_by_key"].items() for _ in range(n)]
    assert len([k for k in calls if k == f"irrev-{done.meta['dev.irrev/hold']}"]) == 1


async def test_a_keyless_repeat_of_an_ambiguous_call_is_not_sent_again(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """The first attempt made the effect and then timed out: ambiguous. Its server does
    not declare that it deduplicates, so no repeat reaches it (contract 4)."""
    tenant = mcp_gateway.tenant("keyless")
    arguments = order(quantity=3, supplier_id=f"s-{uuid.uuid4().hex[:8]}")
    faults = await tools_http.post(f"/{tenant.namespace}/_faults", json={"hang_after_effect": True})
    assert faults.status_code == 200
    try:
        before = (await tool_stats(tools_http, tenant))["calls"]
        async with (
            agent(mcp_gateway.url, tenant.auth("buyer-01")) as first,
            agent(mcp_gateway.url, tenant.auth("buyer-01")) as second,
        ):
            answers = [await first.call_tool("procure__place_order", arguments)]
            for client in (second, first, second):
                answers.append(await client.call_tool("procure__place_order", arguments))
    finally:
        await tools_http.post(f"/{tenant.namespace}/_faults", json={})
    assert [structured(a)["reason"] for a in answers] == ["upstream_ambiguous"] * 4
    keys = {structured(a)["idempotency_key"] for a in answers}
    assert len(keys) == 1 and keys.pop().startswith("content-")
    for answer in answers:
        text = text_of(answer.content[0])
        assert text.startswith("irrev cannot tell yet whether this call took effect: "), text
        assert "repeat the same call later" in text, text
        assert "_meta" not in text and "idempotency" not in text, text
        assert structured(answer)["retry"] == "same_call"
    assert len({structured(a)["hold"] for a in answers}) == 1
    assert (await tool_stats(tools_http, tenant))["calls"] == before + 1


async def test_different_arguments_are_different_calls(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("keyless")
    supplier = f"s-{uuid.uuid4().hex[:8]}"
    before = await tool_stats(tools_http, tenant)
    async with agent(mcp_gateway.url, tenant.auth("buyer-02")) as client:
        one = await client.call_tool("procure__place_order", order(2, supplier_id=supplier))
        two = await client.call_tool("procure__place_order", order(3, supplier_id=supplier))
        again = await client.call_tool("procure__place_order", order(2, supplier_id=supplier))
    assert not (one.is_error or two.is_error or again.is_error)
    assert structured(one)["effect"] != structured(two)["effect"]
    assert again.structured_content == one.structured_content
    assert "earlier identical call" in text_of(again.content[-1])
    after = await tool_stats(tools_http, tenant)
    assert (after["calls"], after["effects"]) == (before["calls"] + 2, before["effects"] + 2)


def raw_call(arguments_json: str) -> bytes:
    """A keyless tools/call with its arguments' digits exactly as given."""
    return (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"procure__place_order",'
        f'"arguments":{arguments_json},"_meta":{{"io.modelcontextprotocol/protocolVersion":'
        '"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},'
        '"io.modelcontextprotocol/clientCapabilities":{}}}}'
    ).encode()


def digest_of(*parts: bytes) -> str:
    """The gateway's fingerprint, computed here from its definition (each part's
    length, then the part), so that the test does not take the gateway's word for it."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:40]


async def test_a_number_spelled_another_way_is_the_same_call(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """10, 10.0 and 1e1 are one number to JSON Schema and to the SDK's server: a
    keyless host that respells it repeats the same call, held under the key its
    plain spelling always had (a hold in flight across an upgrade keeps it)."""
    tenant = mcp_gateway.tenant("keyless")
    supplier = f"s-{uuid.uuid4().hex[:8]}"
    headers = {
        **tenant.auth("buyer-02"),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "procure__place_order",
    }
    before = await tool_stats(tools_http, tenant)
    results = []
    for quantity in ("10", "10.0", "1e1", "10"):
        arguments = (
            f'{{"supplier_id":"{supplier}","sku":"bolts","quantity":{quantity},"unit_price":"100"}}'
        )
        response = await http.post("/mcp", content=raw_call(arguments), headers=headers)
        assert response.status_code == 200, response.text
        results.append(response.json()["result"])
    assert not any(result["isError"] for result in results), results
    body = json.dumps(order(10, supplier_id=supplier), sort_keys=True, separators=(",", ":"))
    key = f"content-{digest_of(b'CALL', b'/place_order', b'', body.encode())}-1"
    assert [result["_meta"]["dev.irrev/idempotency_key"] for result in results] == [key] * 4
    assert len({result["_meta"]["dev.irrev/price"] for result in results}) == 1
    assert len({json.dumps(result["structuredContent"]) for result in results}) == 1
    after = await tool_stats(tools_http, tenant)
    assert (after["calls"], after["effects"]) == (before["calls"] + 1, before["effects"] + 1)


async def test_a_route_that_repeats_on_purpose_makes_every_identical_call(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("repeats")  # dedupe_window: 0
    arguments = order(1, supplier_id=f"s-{uuid.uuid4().hex[:8]}")
    before = (await tool_stats(tools_http, tenant))["effects"]
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        one = await client.call_tool("procure__place_order", arguments)
        two = await client.call_tool("procure__place_order", arguments)
    assert structured(one)["effect"] != structured(two)["effect"]
    assert (await tool_stats(tools_http, tenant))["effects"] == before + 2


async def test_a_rejection_reaches_the_model_on_the_repeat(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    tenant = mcp_gateway.tenant("keyless")
    target = deletion()
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        pending = await client.call_tool(DELETION_TOOL, target)
        escalation = structured(pending)["escalation"]
        await decide(http, tenant, escalation, "reject", "that repo still serves billing")
        after = await client.call_tool(DELETION_TOOL, target)
    assert structured(after)["reason"] == "escalation_rejected"
    assert structured(after)["note"] == "that repo still serves billing"
    assert structured(after)["by"] == "alice"
    text = text_of(after.content[0])
    assert 'A person (alice) rejected this call, saying: "that repo still serves billing"' in text
    assert "Do not repeat it" in text
    assert target["repo"] not in str(await tool_stats(tools_http, tenant))


async def test_a_call_waits_for_the_decision_and_returns_the_result(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """escalation_wait: the host's one call holds until a person approves, reporting
    progress to a client that asked for it, and returns the tool's own result."""
    tenant = mcp_gateway.tenant("keyless-wait")
    target = deletion()
    progressed = asyncio.Event()
    reports: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append(message)
        progressed.set()

    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        call = asyncio.create_task(
            client.call_tool(DELETION_TOOL, target, progress_callback=on_progress)
        )
        await asyncio.wait_for(progressed.wait(), timeout=10)
        mine = [e for e in await queue(http, tenant) if f"escalation {e}" in (reports[0] or "")]
        assert len(mine) == 1, reports
        await decide(http, tenant, mine[0], "approve", "go ahead")
        result = await asyncio.wait_for(call, timeout=20)
    assert not result.is_error, result
    assert structured(result)["repo"] == target["repo"]
    assert 'approved this call, saying: "go ahead"' in text_of(result.content[-1])
    assert "earlier identical call" not in " ".join(text_of(c) for c in result.content)
    stats = await tool_stats(tools_http, tenant)
    assert result.meta is not None
    assert stats["calls_by_key"][f"irrev-{result.meta['dev.irrev/hold']}"] == 1


async def test_a_call_that_waits_in_vain_says_it_is_pending_and_how_to_ask_again(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """Without a progress token the answer is one JSON document after the wait; a
    rejection while it waits is the answer."""
    tenant = mcp_gateway.tenant("keyless-wait")
    target = deletion()
    before = await queue(http, tenant)
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        call = asyncio.create_task(client.call_tool(DELETION_TOOL, target))
        mine = await arrived(http, tenant, before)
        await decide(http, tenant, mine.pop(), "reject", "not today")
        rejected = await asyncio.wait_for(call, timeout=20)
    assert structured(rejected)["reason"] == "escalation_rejected"
    assert '"not today"' in text_of(rejected.content[0])


async def test_a_call_with_its_own_key_waits_only_if_it_asked_for_progress(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """A program that sends its own `_meta` key repeats it when it will: it is answered
    "escalated" at once, so a rejection made after the escalation was queued is not its
    answer (it reads it on its repeat). With a progress token it waits like a host's
    call, and the rejection is its answer."""
    tenant = mcp_gateway.tenant("keyless-wait")  # escalation_wait 15s

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        """Asks for progress (the reports themselves: the test above)."""

    answers = {}
    for asked_progress in (False, True):
        before = await queue(http, tenant)
        async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
            call = asyncio.create_task(
                client.call_tool(
                    DELETION_TOOL,
                    deletion(),
                    meta=key(),
                    progress_callback=on_progress if asked_progress else None,
                )
            )
            mine = await arrived(http, tenant, before)
            await decide(http, tenant, mine.pop(), "reject", "not today")
            answers[asked_progress] = await asyncio.wait_for(call, timeout=20)
    assert structured(answers[False])["status"] == "escalated", answers[False]
    assert structured(answers[True]).get("reason") == "escalation_rejected", answers[True]


def said(result: Any) -> str:
    return " ".join(text_of(c) for c in result.content if c.type == "text")


def assert_not_asked_to_repeat(text: str) -> None:
    """A call held under a key of its own (no key sent, `dedupe_window: 0`): an identical
    call is a new effect, so the model is told to check, never to repeat it, and never
    asked for a key its host cannot send."""
    assert "_meta" not in text and "keyless-" not in text, text
    assert "repeat the same call" not in text and "identical call again" not in text, text
    assert "do not make this call again" in text, text
    assert "whether it was made (read what it changes, or list what exists)" in text, text


async def test_an_ambiguous_call_on_a_route_that_repeats_is_not_advised_again(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """dedupe_window 0: a repeat would be a second payment, so "repeat the same call to
    learn what happened" would make it twice (the hunt's reproduction)."""
    tenant = mcp_gateway.tenant("repeats")
    arguments = order(1, supplier_id=f"s-{uuid.uuid4().hex[:8]}")
    before = (await tool_stats(tools_http, tenant))["effects"]
    await tools_http.post(f"/{tenant.namespace}/_faults", json={"hang_after_effect": True})
    try:
        async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
            first = await client.call_tool("procure__place_order", arguments)
    finally:
        await tools_http.post(f"/{tenant.namespace}/_faults", json={})
    assert first.is_error and structured(first)["reason"] == "upstream_ambiguous"
    text = said(first)
    assert text.startswith("irrev cannot tell yet whether this call took effect: "), text
    assert_not_asked_to_repeat(text)
    assert structured(first)["retry"] == "no"
    assert_not_asked_to_repeat(structured(first)["detail"])
    assert (await tool_stats(tools_http, tenant))["effects"] == before + 1


async def test_a_tool_error_on_a_route_that_repeats_asks_for_no_key(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient
) -> None:
    """flaky_order makes the order, then reports an error: whether it acted is unknown."""
    tenant = mcp_gateway.tenant("repeats")
    arguments = order(1, supplier_id=f"s-{uuid.uuid4().hex[:8]}")
    async with agent(mcp_gateway.url, tenant.auth("buyer-01")) as client:
        result = await client.call_tool("procure__flaky_order", arguments)
    text = text_of(result.content[-1])
    assert "whether it acted is unknown" in text, text
    assert_not_asked_to_repeat(text)


async def test_an_escalation_on_a_route_that_repeats_asks_for_no_key(
    mcp_gateway: McpGateway, http: httpx.AsyncClient
) -> None:
    """Answered "pending" at once (escalation_wait 0): an identical call would be a
    second escalation, not this one's result."""
    tenant = mcp_gateway.tenant("repeats-now")
    async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
        pending = await client.call_tool(DELETION_TOOL, deletion())
    assert structured(pending)["status"] == "escalated"
    text = said(pending)
    assert "if a person approves it, irrev makes it then" in text, text
    assert_not_asked_to_repeat(text)
    assert structured(pending)["retry"] == "no"


async def test_an_approved_wait_that_ends_ambiguous_asks_for_the_identical_call(
    mcp_gateway: McpGateway, tools_http: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """A keyless call waits for the person (escalation_wait); approved, the effect is
    made but its answer is lost. The waiting call and its repeat are worded as the
    keyless call they are: the identical call again, never a `_meta` key (the hunt's
    reproduction)."""
    tenant = mcp_gateway.tenant("keyless-wait")
    target = deletion()
    before = await queue(http, tenant)
    effects = (await tool_stats(tools_http, tenant))["effects"]
    await tools_http.post(f"/{tenant.namespace}/_faults", json={"hang_after_effect": True})
    try:
        async with agent(mcp_gateway.url, tenant.auth("dev-01")) as client:
            call = asyncio.create_task(client.call_tool(DELETION_TOOL, target))
            mine = await arrived(http, tenant, before)
            response = await http.post(
                f"/v1/escalations/{mine.pop()}/approve",
                headers=tenant.admin_auth,
                json={"reason": "ok"},
            )
            assert response.json()["reason"] == "upstream_ambiguous", response.text
            waited = await asyncio.wait_for(call, timeout=25)
            again = await client.call_tool(DELETION_TOOL, target)
    finally:
        await tools_http.post(f"/{tenant.namespace}/_faults", json={})
    for answer in (waited, again):
        assert structured(answer)["reason"] == "upstream_ambiguous", answer
        text = said(answer)
        assert "_meta" not in text and "idempotency" not in text, text
        assert "make the identical call again (the same arguments) later" in text, text
        assert structured(answer)["retry"] == "same_call"
        assert structured(answer)["idempotency_key"].startswith("content-"), answer
    assert structured(waited)["hold"] == structured(again)["hold"]
    assert (await tool_stats(tools_http, tenant))["effects"] == effects + 1
