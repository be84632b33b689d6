"""A generic config-driven MCP host (issue 29): FastMCP's `Client` built from the README's
`mcpServers` config (examples/clients/mcp_host_config.py), which sends no idempotency
key, in front of a payments MCP server that pays every call it gets
(tests/clients/mcp_payments.py): through irrev, and without it (`direct`: the same
config pointed at the server itself). No model: the host makes the calls a model that
repeats itself makes.

- Escalated: pay(hank, 1100) made 4 times over 2 connections, then an operator approves
  every escalation in the queue. Variants on the route's default 20 s wait: the approval
  arrives while two connections wait; a host whose own timeout is shorter gives up first.
- Ambiguous: the first call pays and is then not answered (it hangs past the gateway's
  upstream timeout, or a 504 comes back); the model makes it 3 more times.
- Two calls with different amounts.

Each test asserts the payments the server made; docs/clients.md has the figures."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from .conftest import McpPayments, fresh

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "clients"))
from mcp_host_config import TIMEOUT_S, Said, ask, host_config, payment_tool, repeat

# The host's own timeout for a call: past the gateway's upstream timeout (2 s here), so
# that irrev's answer to a call that hangs arrives first; the host without irrev gives
# up on such a call after it.
HOST_TIMEOUT_S = 5.0
WAIT_DEADLINE_S = 15.0


def config(mcp: McpPayments, via: str, tenant: str = "host") -> dict[str, Any]:
    """The host's config: irrev's /mcp with the agent's token, or the server itself."""
    if via == "direct":
        return host_config(f"{mcp.tool_server.url}/mcp", {})
    headers = {"Authorization": f"Bearer {mcp.token(tenant)}"}
    return host_config(f"{mcp.gateway.url}/mcp", headers)


async def approve_new(mcp: McpPayments, tenant: str, before: set[str], note: str) -> set[str]:
    """The operator approves every escalation that joined the queue since `before`."""
    waiting = await mcp.queue(tenant) - before
    for escalation in waiting:
        await mcp.approve(escalation, note)
    return waiting


async def until(condition: asyncio.Event, what: str) -> None:
    try:
        await asyncio.wait_for(condition.wait(), WAIT_DEADLINE_S)
    except TimeoutError:
        pytest.fail(f"{what} within {WAIT_DEADLINE_S:g} s")


@pytest.mark.parametrize(("via", "payments"), [("direct", 4), ("irrev", 1)])
async def test_an_escalated_call_repeated_4_times_over_2_connections(
    via: str, payments: int, mcp_payments: McpPayments
) -> None:
    hank: dict[str, Any] = {"recipient": fresh("hank"), "amount": 1100}
    before = await mcp_payments.queue("host")
    said = await repeat(config(mcp_payments, via), hank, 4, HOST_TIMEOUT_S)
    approved = await approve_new(mcp_payments, "host", before, "invoice INV-1100")
    paid = await mcp_payments.paid(hank["recipient"])
    assert len(paid) == payments, said
    if via == "direct":
        assert all(s.ok for s in said), said
        # The host sent no key of irrev's: what reached the server is keyless.
        assert not any(k.startswith("dev.irrev/") for p in paid for k in p["meta"]), paid
        return
    structured = [s.structured or {} for s in said]
    assert [s["status"] for s in structured] == ["escalated"] * 4, said
    assert {s["escalation"] for s in structured} == approved
    # Keyed by its content: the host sent no key.
    assert all(s["idempotency_key"].startswith("content-") for s in structured)
    assert all("make the identical call again (the same arguments" in s.text for s in said)
    again = await repeat(config(mcp_payments, via), hank, 1, HOST_TIMEOUT_S)
    assert again[0].ok and again[0].structured == {k: paid[0][k] for k in ("id", *hank)}, again
    assert 'approved this call, saying: "invoice INV-1100"' in again[0].text
    assert len(await mcp_payments.paid(hank["recipient"])) == 1


@pytest.mark.slow
async def test_the_approval_arrives_while_two_connections_wait(
    mcp_payments: McpPayments,
) -> None:
    """The route's default `escalation_wait` (20 s): each connection's call waits,
    told so by progress notifications (FastMCP asks for them on every call), and
    both return the payment once the operator approves."""
    hank: dict[str, Any] = {"recipient": fresh("hank"), "amount": 1100}
    host = config(mcp_payments, "irrev", "host-wait")
    told = [asyncio.Event(), asyncio.Event()]
    messages: list[str | None] = []

    def listener(event: asyncio.Event) -> Any:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            messages.append(message)
            event.set()

        return on_progress

    before = await mcp_payments.queue("host-wait")
    async with (
        Client(host, timeout=TIMEOUT_S, progress_handler=listener(told[0])) as one,
        Client(host, timeout=TIMEOUT_S, progress_handler=listener(told[1])) as two,
    ):
        tool = await payment_tool(one)
        waiting = [asyncio.create_task(ask(c, tool, hank)) for c in (one, two)]
        for event in told:
            await until(event, "a call never reported that it waits")
        approved = await approve_new(mcp_payments, "host-wait", before, "ok by finance")
        said = list(await asyncio.gather(*waiting))
        said += [await ask(c, tool, hank) for c in (one, two)]
    assert len(approved) == 1
    assert all(f"decide escalation {next(iter(approved))}" in (m or "") for m in messages)
    paid = await mcp_payments.paid(hank["recipient"])
    assert len(paid) == 1, said
    assert all(s.ok and s.structured == {k: paid[0][k] for k in ("id", *hank)} for s in said)
    assert all('approved this call, saying: "ok by finance"' in s.text for s in said), said


@pytest.mark.slow
async def test_a_host_that_gives_up_waiting_gets_the_payment_on_its_repeat(
    mcp_payments: McpPayments,
) -> None:
    """A host whose own timeout (1 s) is shorter than the route's wait (20 s): its call
    fails at the host, the escalation stays, and the repeat after the approval gets
    the payment made once."""
    hank: dict[str, Any] = {"recipient": fresh("hank"), "amount": 1100}
    host = config(mcp_payments, "irrev", "host-wait")
    before = await mcp_payments.queue("host-wait")
    gave_up = await repeat(host, hank, 1, timeout_s=1.0)
    assert not gave_up[0].ok and "timed out" in gave_up[0].text, gave_up
    assert len(await approve_new(mcp_payments, "host-wait", before, "fine")) == 1
    again = await repeat(host, hank, 1, HOST_TIMEOUT_S)
    assert again[0].ok, again
    assert len(await mcp_payments.paid(hank["recipient"])) == 1


AMBIGUOUS = [
    pytest.param("direct", "504", 4, id="direct-504"),
    pytest.param("irrev", "504", 1, id="irrev-504"),
    pytest.param("direct", "timeout", 4, id="direct-timeout", marks=pytest.mark.slow),
    pytest.param("irrev", "timeout", 1, id="irrev-timeout", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("via", "fault", "payments"), AMBIGUOUS)
async def test_a_call_whose_first_attempt_ended_ambiguous_repeated_3_times(
    via: str, fault: str, payments: int, mcp_payments: McpPayments
) -> None:
    """The server pays, then answers nothing the caller can read. irrev never sends such
    a call again to a server that does not declare `dedupes` (contract 4)."""
    ivy: dict[str, Any] = {"recipient": fresh("ivy"), "amount": 300}
    await mcp_payments.fail_next(fault)
    said = await repeat(config(mcp_payments, via), ivy, 4, HOST_TIMEOUT_S)
    assert len(await mcp_payments.paid(ivy["recipient"])) == payments, said
    if via == "direct":
        assert not said[0].ok and all(s.ok for s in said[1:]), said
        return
    assert all(not s.ok for s in said), said
    structured = [s.structured or {} for s in said]
    assert [s["reason"] for s in structured] == ["upstream_ambiguous"] * 4
    assert len({s["hold"] for s in structured}) == 1
    assert all("repeat the same call later" in s.text for s in said), said


@pytest.mark.parametrize(("via", "payments"), [("direct", 2), ("irrev", 2)])
async def test_two_different_amounts_are_two_payments(
    via: str, payments: int, mcp_payments: McpPayments
) -> None:
    jo = fresh("jo")
    host = config(mcp_payments, via)
    said: list[Said] = []
    for amount in (200, 250):
        said += await repeat(host, {"recipient": jo, "amount": amount}, 1, HOST_TIMEOUT_S)
    paid = await mcp_payments.paid(jo)
    assert all(s.ok for s in said), said
    assert len(paid) == payments and [p["amount"] for p in paid] == [200, 250]


async def ambiguous_answers(mcp: McpPayments) -> list[Said]:
    """A keyless call whose server answered 504 after paying, and its repeat."""
    await mcp.fail_next("504")
    return await repeat(config(mcp, "irrev"), {"recipient": fresh("kim"), "amount": 50}, 2)


async def test_an_ambiguous_answer_never_asks_a_keyless_host_for_meta(
    mcp_payments: McpPayments,
) -> None:
    said = await ambiguous_answers(mcp_payments)
    assert all("_meta" not in s.text and "idempotency key" not in s.text for s in said), said


async def test_an_ambiguous_answer_never_says_the_call_was_not_made(
    mcp_payments: McpPayments,
) -> None:
    said = await ambiguous_answers(mcp_payments)
    assert not any(s.text.startswith("irrev did not make this call") for s in said), said
