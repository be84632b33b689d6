"""`irrev keys create|rotate|revoke|list`: a tenant's managed keys (agent and admin
credentials kept in Redis, docs/policy.md "Managed keys"), on the configured ledger
(IRREV_REDIS_URL, or the embedded one) as `irrev ledger` reaches it. Every gateway on
that Redis hears of a write at once and serves it from its next policy look.

An agent key must name an agent of the tenant's policy as the fleet's policy store
holds it (what the gateways serve), so a tenant with no stored policy is refused. A
token is printed once, by `create` and `rotate`; `list` never shows one. The CLI
is the operator's: it checks no admin role (the admin API does, for tenant admins).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from rich.table import Table

from gateway.state import managed_keys
from gateway.state.managed_keys import key_view
from irrev import output
from irrev.cli import CliError, bounded
from irrev.commands.ledger import run_on_ledger
from ledger import KeyKind, KeyRecord, KeySpec, Ledger
from pricing import AdminRole, TenantPolicy, load_policy_text

Command = Callable[[Ledger, argparse.Namespace], Awaitable[int]]
MAX_LIFETIME_S = 366 * 24 * 3600


def configure(keys: argparse.ArgumentParser) -> None:
    commands = keys.add_subparsers(dest="keys_command", metavar="COMMAND", required=True)

    create = commands.add_parser("create", help="a new key; prints its token once")
    _tenant(create)
    whose = create.add_mutually_exclusive_group(required=True)
    whose.add_argument("--agent", help="an agent of the tenant's policy")
    whose.add_argument("--admin", help="an admin id (then --role)")
    create.add_argument(
        "--role", choices=[role.value for role in AdminRole], help="an admin key's role"
    )
    create.add_argument("--owner", required=True, help="who the key is for or answers for it")
    create.add_argument("--purpose", default="", help="what the key is for, for its list")
    create.add_argument(
        "--expires-in-s", type=bounded(int, 1, MAX_LIFETIME_S), help="default: never expires"
    )
    _bind(create, _create)

    rotate = commands.add_parser("rotate", help="a new token for a key; the old one stops")
    _tenant(rotate)
    rotate.add_argument("key_id", metavar="KEY_ID", help="the key's id, as `list` shows it")
    _bind(rotate, _rotate)

    revoke = commands.add_parser("revoke", help="revoke a key for good")
    _tenant(revoke)
    revoke.add_argument("key_id", metavar="KEY_ID", help="the key's id, as `list` shows it")
    _bind(revoke, _revoke)

    listing = commands.add_parser("list", help="a tenant's keys (never their tokens)")
    _tenant(listing)
    _bind(listing, _list)


def _tenant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", required=True, help="the tenant whose keys these are")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _bind(parser: argparse.ArgumentParser, command: Command) -> None:
    parser.set_defaults(func=lambda args: run_on_ledger(args, command, _served))


async def _served(ledger: Ledger, args: argparse.Namespace, where: str) -> None:
    """The tenant must have a policy in the fleet's store: keys of a tenant no gateway
    serves would be made for nothing."""
    args.policy = await _policy(ledger, args.tenant, where)


async def _policy(ledger: Ledger, tenant: str, where: str) -> TenantPolicy:
    record = (await ledger.policies.records([tenant])).get(tenant)
    if record is None:
        raise CliError(
            f"tenant {tenant!r} has no policy in the fleet's policy store at {where}; check "
            "--tenant and IRREV_REDIS_URL (a gateway serving its policy file stores it)"
        )
    return load_policy_text(record.text, f"the policy store's version {record.version}")


async def _create(ledger: Ledger, args: argparse.Namespace) -> int:
    if args.admin is not None and args.role is None:
        raise CliError("an admin key needs --role (viewer, approver or policy_admin)")
    if args.agent is not None and args.role is not None:
        raise CliError("--role is for admin keys; an agent key has its agent's caps")
    spec = KeySpec(
        kind=KeyKind.AGENT if args.agent is not None else KeyKind.ADMIN,
        agent=args.agent or "",
        admin=args.admin or "",
        role=args.role or "",
        owner=args.owner,
        purpose=args.purpose,
    )
    life_ms = args.expires_in_s * 1000 if args.expires_in_s is not None else None
    try:
        record, token = await managed_keys.issue(ledger, args.policy, spec, life_ms)
    except ValueError as exc:  # an agent the policy lacks (BadInput is the ledger's)
        raise CliError(str(exc)) from exc
    return await _show(ledger, args, record, token)


async def _rotate(ledger: Ledger, args: argparse.Namespace) -> int:
    record, token = await managed_keys.rotate(ledger, args.tenant, args.key_id)
    return await _show(ledger, args, record, token)


async def _revoke(ledger: Ledger, args: argparse.Namespace) -> int:
    return await _show(ledger, args, await ledger.keys.revoke(args.tenant, args.key_id), None)


async def _show(
    ledger: Ledger, args: argparse.Namespace, record: KeyRecord, token: str | None
) -> int:
    view = key_view(record, await ledger.keys.now_ms())
    if args.json:
        print(json.dumps({**view, "token": token} if token else view, indent=2))
        return 0
    print(f"key {view['key_id']} of {view['tenant']}: {_whose(view)}, {view['state']}")
    if token is not None:
        print(f"token (shown once, keep it now): {token}")
    return 0


def _whose(view: dict[str, Any]) -> str:
    if view["kind"] == "agent":
        return f"agent {view['agent']}"
    return f"admin {view['admin']} ({view['role']})"


async def _list(ledger: Ledger, args: argparse.Namespace) -> int:
    now_ms = await ledger.keys.now_ms()
    views = [key_view(r, now_ms) for r in (await ledger.keys.records([args.tenant]))[args.tenant]]
    if args.json:
        print(json.dumps({"tenant": args.tenant, "keys": views}, indent=2))
        return 0
    table = Table(title=f"keys of {args.tenant}")
    columns = ("key", "for", "owner", "purpose", "state", "expires", "last used", "hash")
    for column in columns:
        table.add_column(column)
    for v in views:
        table.add_row(
            v["key_id"],
            _whose(v),
            v["owner"],
            v["purpose"],
            v["state"],
            v["expires_at"] or "never",
            v["last_used_at"] or "",
            v["token_sha256_prefix"],
        )
    output.console().print(table)
    return 0
