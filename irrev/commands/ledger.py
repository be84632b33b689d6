"""`irrev ledger balance|journal|audit|sweep|trim|reconcile|escrow`: the operator's
view of the ledger, on the configured Redis (IRREV_REDIS_URL) or the embedded one (of
IRREV_DATA_DIR), which every command names on stderr before it reads.

Amounts are integer minor units in the ledger; with the tenant's policy (found in
`--policy-dir`, default IRREV_POLICY_DIR) they are shown with its currency as well.
Every command takes `--json` (one JSON document, or JSON lines for the journal) with
the integers, `<field>_text` amounts and `<name>_at` RFC 3339 times. A tenant the
ledger does not know is refused (exit 1): an empty table would look like an idle
tenant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.table import Table

from gateway.state.policies import load_policy_dir
from irrev import output
from irrev.cli import CliError, bounded
from ledger import (
    Escrow,
    HoldState,
    Ledger,
    LedgerSettings,
    archive_settled,
    audit,
    cutoff_ms,
    read_journal,
    supervised_redis_url,
    trim_locked,
)
from ledger.keys import accounts_key
from pricing import journal_money, money_text, rfc3339, with_money_text

Command = Callable[[Ledger, argparse.Namespace], Awaitable[int]]
Check = Callable[[Ledger, argparse.Namespace, str], Awaitable[None]]
TENANT_HELP = "the tenant's id, as its policy names it"


def configure(ledger: argparse.ArgumentParser) -> None:
    commands = ledger.add_subparsers(dest="ledger_command", metavar="COMMAND", required=True)
    _configure_reads(commands)
    _configure_upkeep(commands)
    _configure_escrow(commands)


def _configure_reads(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read the ledger: balances, the journal and the audit."""
    balance = commands.add_parser("balance", help="limits and balances of a tenant's accounts")
    balance.add_argument("--tenant", required=True, help=TENANT_HELP)
    balance.add_argument("accounts", nargs="*", metavar="ACCOUNT", help="kind:name (all if none)")
    _bind(balance, _balance)

    journal = commands.add_parser("journal", help="print a tenant's journal")
    journal.add_argument("--tenant", required=True, help=TENANT_HELP)
    journal.add_argument("--after", default="-", help="entry id to start after")
    journal.add_argument(
        "--count", type=bounded(int, 1, 10_000), default=100, help="entries to print"
    )
    journal.add_argument("--json", action="store_true", help="JSON lines")
    _bind(journal, _journal)

    check = commands.add_parser(
        "audit", help="replay journals; exit 1 listing every balance that does not match"
    )
    check.add_argument("--tenant", action="append", help="only these tenants (repeatable)")
    check.add_argument(
        "--repair-pools",
        action="store_true",
        help="first rewrite each pooling route's open set from the open holds (a set "
        "out of step after an upgrade: docs/operations.md); the audit then checks them",
    )
    _bind(check, _audit)


def _configure_upkeep(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The operator's upkeep of the ledger: sweep, trim and archive now rather than
    when the gateways would, the ambiguous holds to reconcile, and finishing a
    rolling upgrade."""
    sweep = commands.add_parser("sweep", help="expire a tenant's due holds now")
    sweep.add_argument("--tenant", required=True, help=TENANT_HELP)
    _bind(sweep, _sweep)

    trim = commands.add_parser(
        "trim", help="archive old journal entries to JSON lines, then trim them from Redis"
    )
    trim.add_argument("--tenant", required=True, help=TENANT_HELP)
    trim.add_argument("--archive", required=True, type=Path, help="directory for the archive")
    trim.add_argument(
        "--older-than-s",
        type=bounded(int, 0),
        default=7 * 24 * 3600,
        help="trim entries older than this many seconds (default 7 days)",
    )
    _bind(trim, _trim)

    archive = commands.add_parser(
        "archive",
        help="take a tenant's settled holds out of its Redis slot now (before a reshard: "
        "docs/operations.md, 'Resharding a tenant's slot')",
    )
    archive.add_argument("--tenant", required=True, help=TENANT_HELP)
    archive.add_argument(
        "--older-than-s",
        type=bounded(int, 0),
        default=60,
        help="only holds settled more than this many seconds ago (default 60)",
    )
    _bind(archive, _archive)

    reconcile = commands.add_parser("reconcile", help="list a tenant's ambiguous holds")
    reconcile.add_argument("--tenant", required=True, help=TENANT_HELP)
    _bind(reconcile, _reconcile)

    upgrade = commands.add_parser(
        "upgrade",
        help="the fleet's rolling upgrade: 'status' prints the release flag, 'finish' "
        "(once every gateway runs this release) lets them write this release's records",
    )
    upgrade.add_argument(
        "action", choices=("status", "finish"), help="print the flag, or finish the upgrade"
    )
    _bind(upgrade, _upgrade)


def _configure_escrow(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """A tenant whose fleet outgrows one Redis core, split over escrow shards
    (docs/ledger.md, "Escrow: one tenant over several shards")."""
    escrow = commands.add_parser("escrow", help="split a tenant over shards; show and recover it")
    actions = escrow.add_subparsers(dest="escrow_command", metavar="ACTION", required=True)
    split = actions.add_parser(
        "split", help="split a new tenant over shards in slots (and primaries) of their own"
    )
    split.add_argument("--tenant", required=True, help=TENANT_HELP)
    split.add_argument(
        "--shards", required=True, type=bounded(int, 1, 64), help="how many shards (1-64)"
    )
    _bind(split, _escrow_split, check=_tenant_unchecked)
    show = actions.add_parser(
        "show",
        help="each account's limit, unleased amount and slices; exit 1 if they do not add up",
    )
    show.add_argument("--tenant", required=True, help=TENANT_HELP)
    _bind(show, _escrow_show)
    recover = actions.add_parser(
        "recover",
        help="finish the transfers a process left between their steps; exit 1 if any is stranded",
    )
    recover.add_argument("--tenant", required=True, help=TENANT_HELP)
    _bind(recover, _escrow_recover)


def _bind(parser: argparse.ArgumentParser, command: Command, check: Check | None = None) -> None:
    if command is not _journal:
        parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--policy-dir",
        type=Path,
        default=os.environ.get("IRREV_POLICY_DIR") or None,
        help="tenant policies, for currencies (default IRREV_POLICY_DIR)",
    )

    checked = _check_tenants if check is None else check
    parser.set_defaults(func=lambda args: run_on_ledger(args, command, checked))


def run_on_ledger(args: argparse.Namespace, command: Command, check: Check) -> int:
    """`command` on the configured ledger (IRREV_REDIS_URL, or the embedded one),
    named on stderr first, once `check` (given where the ledger is) passed."""
    settings = LedgerSettings()
    with supervised_redis_url(settings) as url:
        where = safe_url(url) if settings.redis_url else f"{safe_url(url)} (embedded, "
        if not settings.redis_url:
            where += f"data dir {settings.data_dir})"
        print(f"irrev: ledger at {where}", file=sys.stderr)

        async def with_ledger() -> int:
            ledger = Ledger.from_url(url)
            try:
                await check(ledger, args, where)
                return await command(ledger, args)
            finally:
                await ledger.aclose()

        return asyncio.run(with_ledger())


def safe_url(url: str) -> str:
    """`url` without its password (in the authority or a `password` query parameter)."""
    parts = urlsplit(url)
    shown = url
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        shown = shown.replace(parts.netloc, f"{parts.username or ''}:***@{host}", 1)
    if parts.query:
        pairs = parts.query.split("&")
        hidden = ["password=***" if p.lower().startswith("password=") else p for p in pairs]
        shown = shown.replace(f"?{parts.query}", "?" + "&".join(hidden), 1)
    return shown


async def _check_tenants(ledger: Ledger, args: argparse.Namespace, where: str) -> None:
    tenant = getattr(args, "tenant", None)  # a fleet-wide command names none
    asked = tenant if isinstance(tenant, list) else [tenant] if tenant else []
    if not asked:
        return
    for tenant in asked:
        # The ledger checks the name first: a malformed one says so (exit 2), not "unknown".
        await ledger.balances(tenant)
    known = set(await ledger.tenants())
    unknown = [t for t in asked if t not in known]
    if unknown:
        raise UnknownTenant(
            f"no tenant {', '.join(map(repr, unknown))} in the ledger at {where}; "
            "check --tenant, IRREV_REDIS_URL and IRREV_DATA_DIR"
        )


class UnknownTenant(CliError):
    """A tenant the ledger has never seen: exit 1, as a check that found something wrong."""

    exit_code = 1


@dataclass(frozen=True)
class Unit:
    """How a tenant's amounts are shown: its currency and scale from its policy, or
    bare minor units when no policy says."""

    scale: int
    currency: str

    def text(self, amount: int) -> str:
        return money_text(amount, self.scale, self.currency) if self.currency else f"{amount:,}"

    def fields(self, **amounts: int | dict[str, int]) -> dict[str, Any]:
        if not self.currency:
            return dict(amounts)
        return with_money_text(amounts, self.scale, self.currency)


def unit_of(args: argparse.Namespace, tenant: str) -> Unit:
    if args.policy_dir is None or not Path(args.policy_dir).is_dir():
        return Unit(1, "")
    policy = load_policy_dir(Path(args.policy_dir)).get(tenant)
    if policy is None:
        return Unit(1, "")
    return Unit(policy.scale, policy.catalog.currency)


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
    unit = unit_of(args, args.tenant)
    if args.json:
        rows = [
            {
                "account": b.account,
                **unit.fields(
                    limit=b.limit, pending=b.pending, posted=b.posted, available=b.available
                ),
                "window_start_ms": b.window_start_ms,
                "window_start_at": rfc3339(b.window_start_ms),
            }
            for b in balances
        ]
        print(json.dumps({"tenant": args.tenant, "balances": rows}, indent=2))
        return 0
    shown = unit.currency or "minor units"
    table = Table(title=f"balances of {args.tenant} ({shown})")
    for column in ("account", "limit", "pending", "posted", "available", "window start"):
        table.add_column(column, justify="left" if column == "account" else "right")
    for b in balances:
        table.add_row(
            b.account,
            *(unit.text(v) for v in (b.limit, b.pending, b.posted, b.available)),
            rfc3339(b.window_start_ms),
        )
    output.console().print(table)
    return 0


async def _journal(ledger: Ledger, args: argparse.Namespace) -> int:
    """Each entry as stored; with the tenant's policy, its amounts in its currency too."""
    unit = unit_of(args, args.tenant)
    for entry in await read_journal(ledger, args.tenant, after=args.after, count=args.count):
        shown: dict[str, Any] = dict(entry.as_dict())
        if unit.currency:
            changes = [(d.account, d.pending, d.posted) for d in entry.deltas]
            shown = journal_money(shown, changes, unit.scale, unit.currency)
        if args.json:
            # A stream id starts with the Redis time of the entry, in epoch ms.
            at = rfc3339(int(entry.entry_id.partition("-")[0]))
            print(json.dumps({**shown, "at": at}))
            continue
        hidden = ("id", "op", "changes", "currency")
        rest = " ".join(f"{k}={_visible(v)}" for k, v in shown.items() if k not in hidden)
        moved = "; ".join(
            f"{c['account']} pending {_signed(c['pending'], c['pending_text'])} "
            f"posted {_signed(c['posted'], c['posted_text'])}"
            for c in shown.get("changes", [])
        )
        print(f"{entry.entry_id}  {entry.op:<10} {rest}" + (f"  [{moved}]" if moved else ""))
    return 0


def _visible(value: object) -> str:
    """A value as text a terminal shows as it is: a control character (a carriage
    return, an escape sequence) in an agent's key or path would overwrite the line
    with one of its own making, so any that is not printable is written escaped."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _signed(amount: int, text: str) -> str:
    return f"+{text}" if amount > 0 else text


async def _audit(ledger: Ledger, args: argparse.Namespace) -> int:
    if args.repair_pools:
        for tenant in args.tenant or await ledger.tenants():
            pools = await ledger.repair_pools(tenant)
            if not args.json:
                print(f"{tenant}: open sets rewritten, {len(pools)} routes with holds open")
    reports = await audit(ledger, args.tenant)
    failed = sum(not report.ok for report in reports)
    if args.json:
        shown = [
            {
                "tenant": r.tenant,
                "entries": r.entries,
                "accounts": r.accounts,
                "live_holds": r.live_holds,
                "ok": r.ok,
                "mismatches": [str(m) for m in r.mismatches],
            }
            for r in reports
        ]
        print(json.dumps({"ok": not failed, "tenants": shown}, indent=2))
        return 1 if failed else 0
    for report in reports:
        verdict = "ok" if report.ok else f"{len(report.mismatches)} MISMATCHES"
        print(
            f"{report.tenant}: {report.entries} journal entries, {report.accounts} accounts, "
            f"{report.live_holds} live holds: {verdict}"
        )
        for mismatch in report.mismatches:
            print(f"  {mismatch}")
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
    if args.json:
        print(json.dumps({"tenant": args.tenant, "settled": total}))
    else:
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
    if args.json:
        print(json.dumps({"tenant": args.tenant, "trimmed": count, "archive": str(args.archive)}))
    else:
        print(f"{args.tenant}: archived and trimmed {count} journal entries")
    return 0


async def _archive(ledger: Ledger, args: argparse.Namespace) -> int:
    await ledger.release.read()  # archiving waits for every gateway to read the index
    archived = trimmed = 0
    while True:
        done = await archive_settled(ledger, args.tenant, after_ms=args.older_than_s * 1000)
        if done.held_back:
            print(f"irrev: nothing archived: {done.held_back}", file=sys.stderr)
            return 2
        archived, trimmed = archived + done.archived, trimmed + done.trimmed
        if not done.more:
            break
    if args.json:
        print(json.dumps({"tenant": args.tenant, "archived": archived, "expired": trimmed}))
    else:
        print(
            f"{args.tenant}: {archived} settled holds archived out of its slot, "
            f"{trimmed} index entries past their retention dropped"
        )
    return 0


async def _reconcile(ledger: Ledger, args: argparse.Namespace) -> int:
    held = await ledger.hold_ids(args.tenant, HoldState.AMBIGUOUS)
    unit = unit_of(args, args.tenant)
    rows = []
    for hold_id in held:
        hold = await ledger.hold(args.tenant, hold_id)
        if hold is None:
            continue
        if args.json:
            rows.append(
                {
                    "hold": hold_id,
                    "state": hold.state.value,
                    "ambiguity": hold.ambiguity or "unknown",
                    **unit.fields(amounts=hold.amounts),
                    "created_ms": hold.created_ms,
                    "created_at": rfc3339(hold.created_ms),
                }
            )
        else:
            charged = ", ".join(f"{a}={unit.text(v)}" for a, v in hold.amounts.items())
            print(f"{hold_id}  ambiguous ({hold.ambiguity or 'unknown'})  {charged}")
    if args.json:
        print(json.dumps({"tenant": args.tenant, "ambiguous": rows}, indent=2))
    else:
        print(f"{args.tenant}: {len(held)} ambiguous holds stay charged until reconciled")
    return 0


async def _upgrade(ledger: Ledger, args: argparse.Namespace) -> int:
    """docs/operations.md, "Rolling upgrades"."""
    release = ledger.release
    before = await (release.finish() if args.action == "finish" else release.read())
    state = "upgraded" if release.upgraded else "rolling upgrade"
    if args.json:
        print(json.dumps({"format": release.format, "was": before, "state": state}))
        return 0
    if args.action == "finish" and before < release.format:
        print(f"release format {before} -> {release.format}: every gateway writes it from now on")
    elif release.upgraded:
        print(f"release format {release.format}: every gateway runs this release or a later one")
    else:
        print(
            f"release format {release.format}: a rolling upgrade; gateways of this release "
            "write only what the older ones read until `irrev ledger upgrade finish`"
        )
    return 0


async def _tenant_unchecked(ledger: Ledger, args: argparse.Namespace, where: str) -> None:
    """Nothing to check before a split: its tenant is new to the ledger, so the usual
    check (a tenant the ledger knows) would refuse it; Escrow.split refuses a tenant
    split already, or one with accounts of its own."""


async def _escrow_split(ledger: Ledger, args: argparse.Namespace) -> int:
    escrow = await Escrow.split(ledger, args.tenant, args.shards)
    # A cluster's primary for each shard's slot; a standalone server names none.
    primary = ledger.topology.primary_of
    shards = [
        {"shard": name, "primary": primary(accounts_key(name)) or None} for name in escrow.shards
    ]
    if args.json:
        print(json.dumps({"tenant": escrow.tenant, "shards": shards}, indent=2))
        return 0
    print(
        f"{escrow.tenant}: split over {len(shards)} shards. Its accounts are defined with "
        "the ledger's Escrow.define; gateways do not serve a split tenant yet (docs/ledger.md)"
    )
    for k, shown in enumerate(shards):
        where = f" on {shown['primary']}" if shown["primary"] else ""
        print(f"  shard {k}: {shown['shard']}{where}")
    return 0


async def _escrow_show(ledger: Ledger, args: argparse.Namespace) -> int:
    escrow = await Escrow.of(ledger, args.tenant)
    accounts = await escrow.accounts()
    report = await escrow.audit()
    unit = unit_of(args, escrow.tenant)
    if args.json:
        rows = [
            {
                "account": a.account,
                **unit.fields(
                    limit=a.definition.limit,
                    unleased=a.unleased,
                    slices=dict(zip(escrow.shards, a.slices, strict=True)),
                    used=dict(zip(escrow.shards, a.used, strict=True)),
                ),
            }
            for a in accounts
        ]
        shown = {"tenant": escrow.tenant, "shards": escrow.shards, "accounts": rows}
        checked = {"ok": report.ok, "in_flight": report.in_flight, "mismatches": report.mismatches}
        print(json.dumps({**shown, **checked}, indent=2))
        return 0 if report.ok else 1
    shown_in = unit.currency or "minor units"
    table = Table(title=f"escrow of {escrow.tenant} ({shown_in}; per shard: used of its slice)")
    table.add_column("account")
    for column in ("limit", "unleased", *(f"shard {k}" for k in range(len(escrow.shards)))):
        table.add_column(column, justify="right")
    for a in accounts:
        held = (f"{unit.text(u)} of {unit.text(s)}" for s, u in zip(a.slices, a.used, strict=True))
        table.add_row(a.account, unit.text(a.definition.limit), unit.text(a.unleased), *held)
    output.console().print(table)
    print(f"{report.in_flight} transfers in flight: ", end="")
    print("ok" if report.ok else f"{len(report.mismatches)} MISMATCHES")
    for mismatch in report.mismatches:
        print(f"  {mismatch}")
    return 0 if report.ok else 1


async def _escrow_recover(ledger: Ledger, args: argparse.Namespace) -> int:
    escrow = await Escrow.of(ledger, args.tenant)
    done = await escrow.recover()
    if args.json:
        shown = {"grants": done.grants, "reclaims": done.reclaims, "stranded": done.stranded}
        print(json.dumps({"tenant": escrow.tenant, **shown}, indent=2))
    else:
        print(
            f"{escrow.tenant}: {done.grants} refills and {done.reclaims} reclaims finished, "
            f"{len(done.stranded)} stranded"
        )
        for stranded in done.stranded:
            print(f"  stranded (held nowhere, past the 7-day retention): {stranded}")
    return 1 if done.stranded else 0
