"""`irrev escalations list|approve|reject`: the approval queue of a running gateway,
through its admin API (docs/operations.md, "The approval loop" and "The command line"),
with an operator's token or a tenant admin's, whose role the gateway checks: a viewer
lists, an approver decides. Another tenant's escalation is not found, as in the API.

An approval forwards the effect and answers with the tool's answer, so `approve`
exits 0 only when the effect was made (or, on a decision-only route, its hold is
pending for the in-process tool); approved but refused by the tool, not sent, or of
unknown outcome is said on one line with exit 1: the approval stands either way."""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
from rich.table import Table

from irrev import admin_api, output
from irrev.cli import bounded

MAX_PAGE = 200  # the admin API's bound on a page of the queue


def configure(escalations: argparse.ArgumentParser) -> None:
    commands = escalations.add_subparsers(
        dest="escalations_command", metavar="COMMAND", required=True
    )
    listing = commands.add_parser("list", help="a tenant's queue, oldest first, a page at a time")
    listing.add_argument("--tenant", required=True, help="whose queue")
    listing.add_argument(
        "--limit",
        type=bounded(int, 1, MAX_PAGE),
        default=50,
        help=f"escalations on the page (1-{MAX_PAGE}, default 50)",
    )
    listing.add_argument(
        "--after", metavar="CURSOR", help="the page after this one: the `next` a page printed"
    )
    admin_api.add_connection(listing)
    listing.set_defaults(func=cmd_list)
    for verb, does in (
        ("approve", "approve an escalation: its effect is forwarded once"),
        ("reject", "reject an escalation: the agent's poll gets 403 escalation_rejected"),
    ):
        decide = commands.add_parser(verb, help=does)
        decide.add_argument("escalation", metavar="ESCALATION", help="its id, as `list` shows it")
        decide.add_argument(
            "--reason",
            "--note",
            default="",
            help="why, for the agent and the journal (at most 500 characters on one line)",
        )
        admin_api.add_connection(decide)
        decide.set_defaults(func=cmd_approve if verb == "approve" else cmd_reject)


def cmd_list(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.after is not None:
        params["after"] = args.after
    with admin_api.connect(args) as client:
        url = admin_api.path("v1", "admin", "tenants", args.tenant, "escalations")
        page = admin_api.json_of(admin_api.call(client, "GET", url, params=params))
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    table = Table(title=f"escalations of {args.tenant}: {page['total']} waiting")
    for column in ("escalation", "agent", "route", "request", "price", "why", "age", "left"):
        table.add_column(column)
    for item in page["escalations"]:
        table.add_row(
            item["escalation"],
            item["agent"],
            item["route"],
            item["target"],
            item["price_text"],
            _why(item),
            f"{item['age_s']} s",
            f"{item['expires_in_s']} s",
        )
    console = output.console()
    console.print(table)
    if page["next"] is not None:
        console.print(f"more: --after {page['next']}")
    return 0


def _why(item: dict[str, Any]) -> str:
    """The reason, and the account whose soft band it tripped (none: the route's own
    approval threshold)."""
    account = item["tripped"]["account"]
    return f"{item['reason']} ({account})" if account else item["reason"]


def cmd_reject(args: argparse.Namespace) -> int:
    with admin_api.connect(args) as client:
        url = admin_api.path("v1", "escalations", args.escalation, "reject")
        answer = admin_api.json_of(
            admin_api.call(client, "POST", url, json={"reason": args.reason})
        )
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"rejected {answer['escalation']} (by {answer['by']})")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    with admin_api.connect(args) as client:
        url = admin_api.path("v1", "escalations", args.escalation, "approve")
        response = admin_api.send(client, "POST", url, json={"reason": args.reason})
    approval = approval_of(args.escalation, args.reason, response)
    if args.json:
        print(json.dumps(approval, indent=2))
    else:
        print(approval_line(approval))
    return 0 if approval["effect"] in ("made", "pending") else 1


def approval_of(escalation: str, note: str, response: httpx.Response) -> dict[str, Any]:
    """What an approval did. The gateway marks its own refusals with X-Irrev-Reason and
    the answers of a forwarded approval with X-Irrev-Escalation: with the latter, a
    refusal is the gateway's word on the forward (not sent, outcome unknown) and
    anything else is the tool's own answer; without it, only a decision-only route's
    200 approved anything."""
    reason = response.headers.get("x-irrev-reason")
    body = admin_api.json_or_none(response)
    if response.headers.get("x-irrev-escalation") != "approved":
        decided = isinstance(body, dict) and body.get("status") == "approved"
        if reason is not None or response.status_code != 200 or not decided:
            raise admin_api.Refused(admin_api.refusal(response))
        return _approval(escalation, note, response, "pending")
    if reason is not None:
        return _approval(escalation, note, response, reason, detail=admin_api.refusal(response))
    made = "made" if response.is_success else "refused_by_tool"
    answer = body if body is not None else response.text
    return _approval(escalation, note, response, made, response.status_code, answer=answer)


def _approval(
    escalation: str,
    note: str,
    response: httpx.Response,
    effect: str,
    tool_status: int | None = None,
    *,
    detail: str | None = None,
    answer: Any = None,
) -> dict[str, Any]:
    """One shape for every approval: `effect` is made, pending, refused_by_tool or the
    gateway's reason code for the forward (`detail` its words); `answer` the tool's."""
    # An escalation's id is `<tenant>.<hold>` (gateway/edge/responses.py, escalation_id): a
    # decision-only approval's answer names no hold.
    hold = response.headers.get("x-irrev-hold", escalation.rpartition(".")[2])
    return {
        "status": "approved",
        "escalation": escalation,
        "hold": hold,
        "note": note or None,
        "effect": effect,
        "tool_status": tool_status,
        "detail": detail,
        "answer": answer,
    }


def approval_line(approval: dict[str, Any]) -> str:
    escalation, effect = approval["escalation"], approval["effect"]
    if effect == "pending":
        return f"approved {escalation}: hold {approval['hold']} is pending for its in-process tool"
    if effect == "made":
        return f"approved {escalation}: the tool answered {approval['tool_status']}"
    if effect == "refused_by_tool":
        status = approval["tool_status"]
        return f"approved {escalation}, but the tool answered {status}: the effect was not made"
    return f"approved {escalation}, but {approval['detail']}"
