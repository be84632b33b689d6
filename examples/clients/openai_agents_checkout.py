"""The OpenAI Agents SDK: a charge as the agent's function tool, behind irrev.

`irrev.openai_agents.http_tool` makes the gateway's `payments` route (a form body)
a function tool; the SDK hands every invocation its tool-call id, which becomes the
charge's Idempotency-Key, so the same tool call run twice (a retry, a resumed run)
charges once. The model reads the tool's answer, or the gateway's sentence saying
why there is none.

With a model, `Runner.run(checkout_agent(client), "Charge cus_1 19.99 USD")` calls it.
This script needs none: it invokes the agent's tool as the SDK does for a model's
tool call, twice with one tool-call id (no model, no network beyond the gateway).
Against the README's payments walk-through (gateway on :8080, payments API on :8902):

    python examples/clients/openai_agents_checkout.py --call-id call_8bX2 --customer cus_1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from agents import Agent, FunctionTool
from agents.tool_context import ToolContext
from pydantic import BaseModel, Field

from irrev.client import IrrevClient
from irrev.openai_agents import http_tool

DEMO_TOKEN = "irrev_jOHvS1LyhHVNzWSljAD02o4VdfY3N-OlzaYZulh94ns"  # checkout-01, demo only


class Charge(BaseModel):
    customer: str = Field(description="the customer's id, e.g. cus_1")
    amount: int = Field(description="the amount in cents: 1999 is 19.99 USD")
    currency: str = Field(description="always usd")


def checkout_agent(client: IrrevClient) -> Agent[None]:
    charge = http_tool(
        client,
        name="charge_customer",
        description="Charge a customer's card. Each call is one charge.",
        tool="payments",
        method="POST",
        path="/v1/charges",
        args_schema=Charge,
        body="form",
    )
    return Agent(name="checkout", instructions="Charge customers as asked.", tools=[charge])


async def invoke(tool: FunctionTool, call_id: str, arguments: str) -> str:
    """The tool run as the SDK runs it for a model's tool call `call_id`."""
    context: ToolContext[None] = ToolContext(
        context=None, tool_name=tool.name, tool_call_id=call_id, tool_arguments=arguments
    )
    return str(await tool.on_invoke_tool(context, arguments))


async def main(args: argparse.Namespace) -> None:
    client = IrrevClient(args.gateway, args.token)
    try:
        tool = checkout_agent(client).tools[0]
        assert isinstance(tool, FunctionTool)
        arguments = json.dumps({"customer": args.customer, "amount": args.cents, "currency": "usd"})
        for _ in range(2):  # a retry of one tool call: one charge
            print(await invoke(tool, args.call_id, arguments))
    finally:
        await client.aclose()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--call-id", required=True)
    parser.add_argument("--customer", default="cus_1")
    parser.add_argument("--cents", type=int, default=1999)
    parser.add_argument("--gateway", default=os.environ.get("IRREV_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("IRREV_TOKEN", DEMO_TOKEN))
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
