"""`irrev holds show|resolve`: one hold of a running gateway's tenant, through its admin
API (docs/operations.md, "The command line"): what it is and what it would send (the
body an approver reads before deciding, which the queue leaves out), and the hand
resolution of an ambiguous one, posted or voided with a reason, as the console does.
A viewer shows; resolving takes an approver (or an operator)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from irrev import admin_api
from irrev.cli import CliError

# What `show` prints, in this order, when the hold has it.
SHOWN = (
    "state",
    "decision",
    "reason",
    "agent",
    "principal",
    "route",
    "target",
    "headers",
    "face_value_text",
    "price_text",
    "amounts_text",
    "posted_text",
    "created_at",
    "deadline_at",
    "escalation",
    "by",
    "note",
    "ambiguity",
    "resolved_by",
    "resolution_note",
    "body",
)


def configure(holds: argparse.ArgumentParser) -> None:
    commands = holds.add_subparsers(dest="holds_command", metavar="COMMAND", required=True)
    show = commands.add_parser("show", help="a hold in any state, with its effect's request")
    _hold(show)
    show.set_defaults(func=cmd_show)
    resolve = commands.add_parser(
        "resolve", help="settle an ambiguous hold by hand: posted (it happened) or voided"
    )
    _hold(resolve)
    resolve.add_argument(
        "outcome",
        choices=("posted", "voided"),
        help="posted: the effect happened, charged at its price; voided: it did not, released",
    )
    resolve.add_argument(
        "--reason",
        "--note",
        required=True,
        help="what you found out, journaled with your name (at most 500 characters)",
    )
    resolve.set_defaults(func=cmd_resolve)


def _hold(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", required=True, help="whose hold")
    parser.add_argument("hold", metavar="HOLD", help="the hold's id (X-Irrev-Hold, `hold`)")
    admin_api.add_connection(parser)


def _url(args: argparse.Namespace, *rest: str) -> str:
    return admin_api.path("v1", "admin", "tenants", args.tenant, "holds", args.hold, *rest)


def cmd_show(args: argparse.Namespace) -> int:
    with admin_api.connect(args) as client:
        view = admin_api.json_of(admin_api.call(client, "GET", _url(args)))
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    print(f"hold {view['hold']} of {args.tenant}")
    for field in SHOWN:
        if view.get(field) not in (None, "", []):
            print(f"  {field}: {_text(view[field])}")
    return 0


def _text(value: Any) -> str:
    """A field on its line: a list's items and a mapping's pairs (amounts by account)
    separated by semicolons."""
    if isinstance(value, dict):
        return "; ".join(f"{key} {item}" for key, item in value.items())
    if isinstance(value, list):
        return "; ".join(map(str, value))
    return str(value)


def cmd_resolve(args: argparse.Namespace) -> int:
    if not args.reason.strip():
        raise CliError("--reason must say what you found out; it is journaled with your name")
    with admin_api.connect(args) as client:
        body = {"outcome": args.outcome, "reason": args.reason}
        answer = admin_api.json_of(admin_api.call(client, "POST", _url(args, "resolve"), json=body))
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"hold {answer['hold']} of {args.tenant}: {answer['state']} by {answer['by']}")
    return 0
