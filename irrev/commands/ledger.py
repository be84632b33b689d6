"""`irrev ledger balance|journal|audit|sweep|reconcile`: the operator's view of the
ledger, on the configured Redis (IRREV_REDIS_URL) or the embedded one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from irrev.cli import bounded
from ledger import HoldState, Ledger, audit, cutoff_ms, open_ledger, read_journal, trim_locked

Command = Callable[[Ledger, argparse.Namespace], Awaitable[int]]


def configure(ledger: argparse.ArgumentParser) -> None:
    commands = ledger.add_subparsers(dest="ledger_command", metavar="COMMAND", required=True)

    balance = commands.add_parser("balance", help="limits and balances of a tenant's accounts")
    balance.add_argument("--tenant", required=True)
    balance.add_argument("accounts", nargs="*", metavar="ACCOUNT", help="kind:name (all if none)")
    _bind(balance, _balance)

    journal = commands.add_parser("journal", help="print a tenant's journal")
    journal.add_argument("--tenant", required=True)
    journal.add_argument("--after", default="-", help="entry id to start after")
    journal.add_argument("--count", type=bounded(int, 1, 10_000), default=100)
    journal.add_argument("--json", action="store_true", help="JSON lines")
    _bind(journal, _journal)

    check = commands.add_parser(
        "audit", help="replay journals; exit 1 listing every balance that does not match"
    )
    check.add_argument("--tenant", action="append", help="only these tenants (repeatable)")
    _bind(check, _audit)

    sweep = commands.add_parser("sweep", help="expire a tenant's due holds now")
    sweep.add_argument("--tenant", required=True)
    _bind(sweep, _sweep)

    trim = commands.add_parser(
        "trim", help="archive old journal entries to JSON lines, then trim them from Redis"
    )
    trim.add_argument("--tenant", required=True)
    trim.add_argument("--archive", required=True, type=Path, help="directory for the archive")
    trim.add_argument("--older-than-s", type=bounded(int, 0), default=7 * 24 * 3600)
    _bind(trim, _trim)

    reconcile = commands.add_parser("reconcile", help="list a tenant's ambiguous holds")
    reconcile.add_argument("--tenant", required=True)
    _bind(reconcile, _reconcile)


def _bind(parser: argparse.ArgumentParser, command: Command) -> None:
    def run(args: argparse.Namespace) -> int:
        async def with_ledger() -> int:
            async with open_ledger() as ledger:
                return await command(ledger, args)

        return asyncio.run(with_ledger())

    parser.set_defaults(func=run)


async def _balance(ledger: Ledger, args: argparse.Namespace) -> int:
    balances = await ledger.balances(args.tenant)
    if args.accounts:
        balances = [b for b in balances if b.account in set(args.accounts)]
        missing = set(args.accounts) - {b.account for b in balances}
        if missing:
            print(
                f"irrev: no such account of {args.tenant}: {', '.join(sorted(missing))}",
                file=sys.stderr,
            )
            return 1
    table = Table(title=f"balances of {args.tenant}")
    for column in ("account", "limit", "pending", "posted", "available", "window start"):
        table.add_column(column, justify="left" if column == "account" else "right")
    for b in balances:
        table.add_row(
            b.account,
            f"{b.limit:,}",
            f"{b.pending:,}",
            f"{b.posted:,}",
            f"{b.available:,}",
            str(b.window_start_ms),
        )
    Console().print(table)
    return 0


async def _journal(ledger: Ledger, args: argparse.Namespace) -> int:
    for entry in await read_journal(ledger, args.tenant, after=args.after, count=args.count):
        if args.json:
            print(json.dumps(entry.as_dict()))
        else:
            shown = entry.as_dict().items()
            rest = " ".join(f"{k}={v}" for k, v in shown if k not in ("id", "op"))
            print(f"{entry.entry_id}  {entry.op:<10} {rest}")
    return 0


async def _audit(ledger: Ledger, args: argparse.Namespace) -> int:
    reports = await audit(ledger, args.tenant)
    failed = 0
    for report in reports:
        verdict = "ok" if report.ok else f"{len(report.mismatches)} MISMATCHES"
        print(
            f"{report.tenant}: {report.entries} journal entries, {report.accounts} accounts, "
            f"{report.live_holds} live holds: {verdict}"
        )
        for mismatch in report.mismatches:
            print(f"  {mismatch}")
        failed += not report.ok
    if not reports:
        print("no tenants in the ledger")
    return 1 if failed else 0


async def _sweep(ledger: Ledger, args: argparse.Namespace) -> int:
    total = 0
    while True:
        result = await ledger.sweep(args.tenant, batch=500)
        total += result.visited
        if result.remaining_due == 0 or result.visited == 0:
            break
    print(f"{args.tenant}: settled {total} due holds")
    return 0


async def _trim(ledger: Ledger, args: argparse.Namespace) -> int:
    before_ms = await cutoff_ms(ledger, args.older_than_s)
    count = await trim_locked(ledger, args.tenant, args.archive, before_ms)
    if count is None:
        print(
            f"irrev: another process is trimming {args.tenant}'s journal; try again later",
            file=sys.stderr,
        )
        return 2
    print(f"{args.tenant}: archived and trimmed {count} journal entries")
    return 0


async def _reconcile(ledger: Ledger, args: argparse.Namespace) -> int:
    held = await ledger.hold_ids(args.tenant, HoldState.AMBIGUOUS)
    for hold_id in held:
        hold = await ledger.hold(args.tenant, hold_id)
        if hold is not None:
            charged = ", ".join(f"{a}={v:,}" for a, v in hold.amounts.items())
            print(f"{hold_id}  ambiguous ({hold.ambiguity or 'unknown'})  {charged}")
    print(f"{args.tenant}: {len(held)} ambiguous holds stay charged until reconciled")
    return 0
