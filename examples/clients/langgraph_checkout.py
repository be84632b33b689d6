"""A LangGraph checkout whose payment step charges the customer through irrev.

The graph is `approve` (a person says yes: a LangGraph interrupt) then `pay` (a
charge through the gateway's `payments` tool, the form-encoded, Stripe-like API of
examples/payments-api.yaml). Its state persists in SQLite
(langgraph-checkpoint-sqlite), so a run outlives its process.

`pay` is a node, not a model's tool call: it has no tool-call id. Its
Idempotency-Key is `irrev.langgraph.step_key_of()`: thread id, node and step, which
every re-run of the step shares. LangGraph re-runs `pay` when the process died after
the charge and before the checkpoint (at-least-once across crashes), and in every
process that resumes the parked `approve` interrupt; the gateway answers each re-run
with the first charge instead of charging again (docs/clients.md measures both).

Try it against the README's payments walk-through (gateway on :8080, payments API on
:8902; the token is payments-api.tokens.yaml's demo token of `checkout-01`):

    python examples/clients/langgraph_checkout.py --thread order-1001 start
    python examples/clients/langgraph_checkout.py --thread order-1001 resume
    python examples/clients/langgraph_checkout.py --thread order-1001 resume   # charges nothing

`start` parks at the approval; `resume` approves and pays, or, if a run of the thread
died after its charge, re-runs `pay`, which the gateway answers with that charge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from irrev.client import IrrevClient
from irrev.langgraph import step_key_of

DEMO_TOKEN = "irrev_jOHvS1LyhHVNzWSljAD02o4VdfY3N-OlzaYZulh94ns"  # checkout-01, demo only


class Checkout(TypedDict, total=False):
    customer: str
    amount_cents: int
    approved: bool
    charge: dict[str, Any]  # the payments API's charge
    refused: str  # why there is none, as the model or a person would read it


class Pay(Protocol):
    """A `pay` node: the state in, the state's update out."""

    def __call__(self, state: Checkout) -> Awaitable[dict[str, Any]]: ...


async def approve(state: Checkout) -> dict[str, Any]:
    """Park the run until a person answers (LangGraph's interrupt); their answer is
    what `Command(resume=...)` carries."""
    answer = interrupt({"charge_cents": state["amount_cents"], "customer": state["customer"]})
    return {"approved": bool(answer)}


def pay_through(client: IrrevClient, key_of: Callable[[], str] = step_key_of) -> Pay:
    """The `pay` node: one charge through the gateway, keyed by `key_of()` (the
    step's key). An escalation waits for a human; running the node again (resuming
    the thread later) asks under the same key, so it picks up that escalation."""

    async def pay(state: Checkout) -> dict[str, Any]:
        if not state.get("approved"):
            return {"refused": "the charge was not approved"}
        form: dict[str, str | int] = {
            "customer": state["customer"],
            "amount": state["amount_cents"],
            "currency": "usd",
        }
        outcome = await client.call("payments", "POST", "/v1/charges", key_of(), form=form)
        return {"charge": outcome.data} if outcome.ok else {"refused": outcome.text}

    return pay


def build(pay: Pay) -> StateGraph[Checkout]:
    graph: StateGraph[Checkout] = StateGraph(Checkout)
    graph.add_node("approve", approve)
    graph.add_node("pay", pay)
    graph.add_edge(START, "approve")
    graph.add_edge("approve", "pay")
    graph.add_edge("pay", END)
    return graph


def first_input(phase: str, customer: str, amount_cents: int) -> Any:
    """What to invoke the graph with: a new checkout; the approval that resumes the
    parked interrupt; or None, which re-runs whatever step the last checkpoint left
    to do (after a crash)."""
    if phase == "start":
        return {"customer": customer, "amount_cents": amount_cents}
    return Command(resume=True) if phase == "resume" else None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    client = IrrevClient(args.gateway, args.token)
    config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
    try:
        async with AsyncSqliteSaver.from_conn_string(args.db) as saver:
            graph = build(pay_through(client)).compile(checkpointer=saver)
            if args.phase == "resume" and not (await graph.aget_state(config)).interrupts:
                args.phase = "continue"  # nothing parked: re-run what is left
            return await graph.ainvoke(first_input(args.phase, args.customer, args.cents), config)
    finally:
        await client.aclose()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["start", "resume", "continue"])
    parser.add_argument("--thread", required=True)
    parser.add_argument("--db", default="checkout.sqlite")
    parser.add_argument("--gateway", default=os.environ.get("IRREV_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("IRREV_TOKEN", DEMO_TOKEN))
    parser.add_argument("--customer", default="cus_1")
    parser.add_argument("--cents", type=int, default=1999)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(parse())), default=str))
