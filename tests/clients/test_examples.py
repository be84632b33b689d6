"""The client examples run as a user runs them (examples/clients/*.py), against the
test's gateway and payments API (the MCP host: its payments MCP server): each makes its
charge once, however often it sends it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import McpPayments, Payments, fresh

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clients"


def run_example(payments: Payments, name: str, *arguments: str) -> list[str]:
    """The lines the example printed, run as `checkout-01` of the payments gateway."""
    token = payments.tenant.tokens["checkout-01"]
    return run(name, payments.gateway.url, token, *arguments)


def run(name: str, gateway: str, token: str, *arguments: str) -> list[str]:
    """The lines the example printed, run against `gateway` with the agent's `token`."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *arguments],
        env={"IRREV_URL": gateway, "IRREV_TOKEN": token, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


async def test_the_plain_python_example_charges_once(payments: Payments) -> None:
    customer = fresh("cus")
    lines = run_example(
        payments, "plain_python.py", "--order", fresh("order"), "--customer", customer
    )
    first, again = (json.loads(line) for line in lines)
    assert first["ok"] and not first["replayed"] and again["replayed"], lines
    assert first["text"] == again["text"]
    assert len(await payments.made(customer=customer)) == 1


async def test_the_openai_agents_example_charges_once(payments: Payments) -> None:
    customer = fresh("cus")
    lines = run_example(
        payments, "openai_agents_checkout.py", "--call-id", fresh("call"), "--customer", customer
    )
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert len(await payments.made(customer=customer)) == 1


@pytest.mark.slow
async def test_the_langgraph_example_parks_pays_and_resumes_without_paying(
    payments: Payments, tmp_path: Path
) -> None:
    customer, thread = fresh("cus"), fresh("order")
    common = ["--thread", thread, "--db", str(tmp_path / "checkout.sqlite"), "--customer", customer]
    parked = json.loads(run_example(payments, "langgraph_checkout.py", "start", *common)[-1])
    assert "__interrupt__" in parked and await payments.made(customer=customer) == []
    paid = json.loads(run_example(payments, "langgraph_checkout.py", "resume", *common)[-1])
    assert paid["charge"]["customer"] == customer, paid
    again = json.loads(run_example(payments, "langgraph_checkout.py", "resume", *common)[-1])
    assert again["charge"] == paid["charge"]
    assert len(await payments.made(customer=customer)) == 1


async def test_the_mcp_host_example_pays_once_in_two_runs(mcp_payments: McpPayments) -> None:
    """Two runs of the host (two processes, four connections), an approval between."""
    recipient = fresh("hank")
    arguments = ("--recipient", recipient, "--amount", "1100")
    host = (mcp_payments.gateway.url, mcp_payments.token("host"))
    before = await mcp_payments.queue("host")
    pending = [json.loads(line) for line in run("mcp_host_config.py", *host, *arguments)]
    assert [said["structured"]["status"] for said in pending] == ["escalated"] * 2, pending
    escalation = pending[0]["structured"]["escalation"]
    assert await mcp_payments.queue("host") - before == {escalation}
    await mcp_payments.approve(escalation, "approved in the example")
    done = [json.loads(line) for line in run("mcp_host_config.py", *host, *arguments)]
    paid = await mcp_payments.paid(recipient)
    assert len(paid) == 1 and all(said["ok"] for said in done), done
    assert all(said["structured"]["id"] == paid[0]["id"] for said in done)
