"""A generic MCP host behind irrev: a client built from an `mcpServers` config, as
desktop and IDE hosts are, with no code of irrev's and no idempotency key.

The host here is FastMCP's `Client` (fastmcp-slim 4.2) given the README's config:
irrev's `/mcp` URL and the agent's token as a header, nothing else. It sends no key
in `_meta`, so irrev keys each call by its content (the agent, the tool and the
arguments as priced): a model that repeats a call, told that it waits for a person or
that its outcome is not known yet, repeats the same call, on any connection, and a
tool server that pays every call it gets pays once.

This script is such a host without a model: it lists the tools, finds the payment
tool, and makes the same call `--times` times, alternately over two connections,
printing what the model reads of each answer (one JSON line each). Against the
README's payments walk-through's gateway (`irrev serve --policy-dir examples` serves
`examples/mcp-payments.yaml`; the token is mcp-payments.tokens.yaml's demo token of
`assistant-01`) and the tests' payments MCP server, which pays every call:

    MCP_PAYMENTS_LEDGER=/tmp/paid.jsonl uvicorn tests.clients.mcp_payments:app --port 8912 &
    python examples/clients/mcp_host_config.py --recipient hank --amount 1100
    # 1,100 USD waits for a person: approve it at /console, then ask again (a new
    # host process, new connections): the payment's result, made once
    python examples/clients/mcp_host_config.py --recipient hank --amount 1100
    # the same config pointed at the server itself: every call is a payment
    python examples/clients/mcp_host_config.py --recipient hank --amount 1100 \
        --direct http://127.0.0.1:8912/mcp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from fastmcp import Client
from mcp.shared.exceptions import MCPError

DEMO_TOKEN = "irrev_EEemBv4ed08FDoqzhenJCQ1NCNAM1rO-TDqJ9C1IJ6g"  # assistant-01, demo only
# How long the host waits for one tool call (FastMCP's default is forever; hosts
# set one). Longer than irrev's `escalation_wait` (20 s by default), so that a call
# waiting for a person is answered, not abandoned.
TIMEOUT_S = 60.0


def host_config(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """The README's config for one Streamable HTTP server: what a host reads."""
    return {"mcpServers": {"irrev": {"type": "http", "url": url, "headers": headers}}}


@dataclass(frozen=True)
class Said:
    """What the model reads of one tool call: the result's text, flagged as an error
    or not, or the host's words for a call that failed (a timeout, an HTTP error).
    `structured` is the result's structured content, for programs."""

    ok: bool
    text: str
    structured: dict[str, Any] | None = None


async def payment_tool(client: Client[Any]) -> str:
    """The listed tool that pays: `pay` on the server itself, `payments__pay` through
    irrev (which names each tool after its server)."""
    names = [tool.name for tool in await client.list_tools()]
    paying = [name for name in names if name == "pay" or name.endswith("__pay")]
    if len(paying) != 1:
        raise LookupError(f"no single payment tool among {names}")
    return paying[0]


async def ask(client: Client[Any], tool: str, arguments: dict[str, Any]) -> Said:
    """One tool call as a host makes it: no `_meta`; a failure is text for the model."""
    try:
        result = await client.call_tool(tool, arguments, raise_on_error=False)
    except MCPError as exc:  # the host tells the model the call failed, and why
        return Said(False, f"Error calling {tool}: {exc.error.message}")
    text = "\n".join(block.text for block in result.content if block.type == "text")
    return Said(not result.is_error, text, result.structured_content)


async def repeat(
    config: dict[str, Any], arguments: dict[str, Any], times: int, timeout_s: float = TIMEOUT_S
) -> list[Said]:
    """The same call `times` times, alternately over two connections of the host
    (two windows, or a reconnect), as a model that repeats itself makes it."""
    async with Client(config, timeout=timeout_s) as one, Client(config, timeout=timeout_s) as two:
        tool = await payment_tool(one)
        return [await ask((one, two)[i % 2], tool, arguments) for i in range(times)]


async def main(args: argparse.Namespace) -> None:
    if args.direct:
        config = host_config(args.direct, {})
    else:
        config = host_config(f"{args.gateway}/mcp", {"Authorization": f"Bearer {args.token}"})
    arguments = {"recipient": args.recipient, "amount": args.amount}
    for said in await repeat(config, arguments, args.times):
        print(json.dumps(asdict(said)))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipient", default="hank")
    parser.add_argument("--amount", type=int, default=1100, help="whole USD")
    parser.add_argument("--times", type=int, default=2)
    parser.add_argument("--gateway", default=os.environ.get("IRREV_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("IRREV_TOKEN", DEMO_TOKEN))
    parser.add_argument("--direct", help="the MCP server's own URL: the same host, no irrev")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
