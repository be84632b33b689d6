"""The OpenAI Agents SDK's function tool (irrev/openai_agents.py, as
examples/clients/openai_agents_checkout.py gives it to an agent), invoked as the SDK
invokes it for a model's tool call, without a model: the same tool-call id twice (a
retry) is one payment, a new id a new one, arguments that do not fit none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agents import FunctionTool

from irrev.client import IrrevClient

from .conftest import Payments, fresh

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "clients"))
from openai_agents_checkout import checkout_agent, invoke


def charge_tool(client: IrrevClient) -> FunctionTool:
    tool = checkout_agent(client).tools[0]
    assert isinstance(tool, FunctionTool)
    return tool


async def test_one_tool_call_invoked_twice_pays_once(
    payments: Payments, client: IrrevClient
) -> None:
    tool, customer, call_id = charge_tool(client), fresh("cus"), fresh("call")
    arguments = json.dumps({"customer": customer, "amount": 2500, "currency": "usd"})
    first = await invoke(tool, call_id, arguments)
    again = await invoke(tool, call_id, arguments)  # the SDK's retry of the same call
    assert json.loads(first)["customer"] == customer and again == first, (first, again)
    assert len(await payments.made(customer=customer)) == 1
    await invoke(tool, fresh("call"), arguments)  # another tool call: another charge
    assert len(await payments.made(customer=customer)) == 2


async def test_arguments_that_do_not_fit_are_the_models_to_fix(
    payments: Payments, client: IrrevClient
) -> None:
    customer = fresh("cus")
    told = await invoke(charge_tool(client), fresh("call"), json.dumps({"customer": customer}))
    assert told.startswith("The charge_customer call was not made: its arguments do not fit")
    assert await payments.made(customer=customer) == []
