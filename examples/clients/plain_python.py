"""Plain Python: a charge through irrev, made once however often it is sent.

The key names the intent, not the attempt: one charge per order (`charge-<order>`),
so a retry after a timeout, a crash or a restart of this script is the same charge.
The payments route takes a form (`form=`); the answer says whether the gateway made
the charge now or answered from its record (`replayed`); a refusal or an escalation
comes back as an Outcome with a sentence for a model or a person (`text`), its reason
code and the numbers behind it (`figures`).

Against the README's payments walk-through (gateway on :8080, payments API on :8902;
the token is payments-api.tokens.yaml's demo token of `checkout-01`):

    python examples/clients/plain_python.py --order 1001
    python examples/clients/plain_python.py --order 1001 --cents 150000   # a larger one
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from irrev.client import IrrevClient, Outcome

DEMO_TOKEN = "irrev_jOHvS1LyhHVNzWSljAD02o4VdfY3N-OlzaYZulh94ns"  # checkout-01, demo only


async def charge(client: IrrevClient, order: str, customer: str, cents: int) -> Outcome:
    form: dict[str, str | int] = {"customer": customer, "amount": cents, "currency": "usd"}
    return await client.call("payments", "POST", "/v1/charges", f"charge-{order}", form=form)


def shown(outcome: Outcome) -> str:
    """What a program reads of an Outcome (a model reads `text` only)."""
    return json.dumps(
        {
            "ok": outcome.ok,
            "replayed": outcome.replayed,
            "reason": outcome.reason,
            "escalation": outcome.escalation,
            "price": outcome.figures.price_text,
            "text": outcome.text,
        }
    )


async def main(args: argparse.Namespace) -> None:
    client = IrrevClient(args.gateway, args.token)
    try:
        # The same order twice, as a retry after a lost answer would send it: one charge.
        for _ in range(2):
            print(shown(await charge(client, args.order, args.customer, args.cents)))
    finally:
        await client.aclose()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--order", required=True)
    parser.add_argument("--customer", default="cus_1")
    parser.add_argument("--cents", type=int, default=1999)
    parser.add_argument("--gateway", default=os.environ.get("IRREV_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("IRREV_TOKEN", DEMO_TOKEN))
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
