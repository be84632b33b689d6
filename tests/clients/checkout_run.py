"""One process of a LangGraph checkout, for tests/clients/test_langgraph.py: the
graph of examples/clients/langgraph_checkout.py, its `pay` node keyed as the test
asks (`--key step|task|uuid`) or paying the tool API itself (`--key none`: no irrev).

`--crash-marker PATH`: once the charge has been answered, `pay` writes PATH and
waits, for the test to SIGKILL this process there: after the effect, before the
checkpoint. `--barrier`: print `ready` once the graph is built and wait for a line on
stdin before invoking it, so that k resumers start together. The last line printed is
the run's final state as JSON.

Run: `python -m tests.clients.checkout_run resume --thread T --db D ...`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.config import get_config

from irrev.client import IrrevClient
from irrev.langgraph import step_key_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "clients"))
from langgraph_checkout import Checkout, Pay, build, first_input, pay_through

# The keys a test compares: the step's (irrev.langgraph), LangGraph's own task id,
# and a new uuid per call (what a client without a stable key sends).
KEYS: dict[str, Callable[[], str]] = {
    "step": step_key_of,
    "task": lambda: str(get_config()["configurable"]["__pregel_task_id"]),
    "uuid": lambda: uuid.uuid4().hex,
}


def pay_directly(tool_api: str) -> Pay:
    """The same charge sent straight to the tool API: no gateway, no key it keeps."""

    async def pay(state: Checkout) -> dict[str, Any]:
        if not state.get("approved"):
            return {"refused": "the charge was not approved"}
        form = {"customer": state["customer"], "amount": state["amount_cents"], "currency": "usd"}
        async with httpx.AsyncClient(trust_env=False) as http:
            response = await http.post(f"{tool_api}/v1/charges", data=form)
        return {"charge": response.json()}

    return pay


def dying_after(pay: Pay, marker: Path) -> Pay:
    """`pay`, then the marker the test waits for, then nothing until SIGKILL."""

    async def paid_then_wait(state: Checkout) -> dict[str, Any]:
        update = await pay(state)
        marker.write_text(json.dumps(update))
        await asyncio.Event().wait()
        return update

    return paid_then_wait


async def run(args: argparse.Namespace) -> dict[str, Any]:
    client = IrrevClient(args.gateway, args.token, pause_s=0.2)
    pay = pay_directly(args.tool_api) if args.key == "none" else pay_through(client, KEYS[args.key])
    if args.crash_marker:
        pay = dying_after(pay, Path(args.crash_marker))
    config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
    try:
        async with AsyncSqliteSaver.from_conn_string(args.db) as saver:
            graph = build(pay).compile(checkpointer=saver)
            if args.barrier:
                print("ready", flush=True)
                await asyncio.to_thread(sys.stdin.readline)
            given = first_input(args.phase, args.customer, args.cents)
            return dict(await graph.ainvoke(given, config))
    finally:
        await client.aclose()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume", "continue"])
    parser.add_argument("--thread", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--key", choices=["none", *KEYS], required=True)
    parser.add_argument("--gateway", default="")
    parser.add_argument("--token", default="")
    parser.add_argument("--tool-api", default="")
    parser.add_argument("--customer", required=True)
    parser.add_argument("--cents", type=int, default=1234)
    parser.add_argument("--crash-marker", default="")
    parser.add_argument("--barrier", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(parse())), default=str), flush=True)
