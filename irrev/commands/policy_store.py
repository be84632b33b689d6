"""`irrev policy pull|push|diff|history`: a tenant's policy in the fleet's store,
through a gateway's admin API (docs/design.md, "Policy changes"). A pulled file
starts with a comment naming the store version it holds; `push` sends it back with
that version as its base (If-Match), so a change made from an older version writes
only what it changed, or is refused where the store changed the same field since."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx

from irrev.admin_api import add_connection, call, connect, json_of, path
from irrev.cli import CliError, bounded
from ledger import POLICY_HISTORY
from pricing import PolicyError, parse_yaml

# The first line of a pulled file: which store version it holds, by its ETag
# (`7-<digest>`). A file pulled before ETags named the digest says the number alone:
# pushed, it is refused (if_match_without_digest), and is to be pulled again.
HEADER = re.compile(r"^# irrev: version (\d+(?:-[0-9a-f]+)?) of tenant (\S+)\n")


def configure(commands: Any) -> None:
    pull = commands.add_parser(
        "pull", help="write the store's version of a tenant's policy to a file (or stdout)"
    )
    pull.add_argument("tenant", help="the tenant whose policy to pull")
    pull.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write it here (default: stdout)"
    )
    add_connection(pull)
    pull.set_defaults(func=cmd_pull)

    push = commands.add_parser(
        "push",
        help="change a tenant's policy in the store to a file, made from the version its "
        "pull header (or --base) names",
    )
    push.add_argument("file", type=Path, metavar="FILE", help="a pulled file, edited")
    push.add_argument(
        "--base", help="the store version the file was made from: its ETag, e.g. 7-3f2a9c1b0d4e"
    )
    add_connection(push)
    push.set_defaults(func=cmd_push)

    diff = commands.add_parser(
        "diff", help="how a file differs from the store's version (exit 1 if it does)"
    )
    diff.add_argument("file", type=Path, metavar="FILE", help="a policy file (pulled or not)")
    add_connection(diff)
    diff.set_defaults(func=cmd_diff)

    history = commands.add_parser("history", help="a tenant's stored versions, newest first")
    history.add_argument("tenant", help="the tenant whose versions to list")
    history.add_argument(
        "--limit",
        type=bounded(int, 1, POLICY_HISTORY),
        default=20,
        help=f"versions to list (1-{POLICY_HISTORY}, default 20)",
    )
    add_connection(history)
    history.set_defaults(func=cmd_history)


def _stored(client: httpx.Client, tenant: str) -> tuple[str, str]:
    """The store's version of `tenant`'s policy: its text and its ETag (unquoted)."""
    url = path("v1", "admin", "tenants", tenant, "policy")
    response = call(client, "GET", url, headers={"Accept": "application/yaml"})
    return response.text, response.headers.get("etag", '"0"').strip('"')


def _number(etag: str) -> int:
    """A store version's number, from its ETag (`7-<digest>`)."""
    return int(etag.partition("-")[0])


def _read(path: Path) -> tuple[str, str | None, str]:
    """The file's policy text (without its pull header), the version the header
    names (its ETag), and its tenant."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it: {exc}") from None
    base = None
    if found := HEADER.match(text):
        base, text = found.group(1), text[found.end() :]
    try:
        data = parse_yaml(text, str(path))
    except PolicyError as exc:
        raise CliError(str(exc).replace("\n", "; ")) from None
    tenant = data.get("tenant") if isinstance(data, dict) else None
    if not isinstance(tenant, str):
        raise CliError(f"{path}: no `tenant:` in it; a policy names its tenant")
    return text, base, tenant


def cmd_pull(args: argparse.Namespace) -> int:
    with connect(args) as client:
        text, etag = _stored(client, args.tenant)
    pulled = f"# irrev: version {etag} of tenant {args.tenant}\n{text}"
    if args.output is not None:
        args.output.write_text(pulled, encoding="utf-8")
    version = _number(etag)
    if args.json:
        print(json.dumps({"tenant": args.tenant, "version": version, "etag": etag, "text": text}))
    elif args.output is None:
        sys.stdout.write(pulled)
    else:
        print(f"{args.output}: version {version} of {args.tenant}", file=sys.stderr)
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    text, pulled, tenant = _read(args.file)
    base = args.base if args.base is not None else pulled
    if base is None:
        raise CliError(
            f"{args.file}: say which store version it was made from: --base ETAG, or "
            f"`irrev policy pull {tenant} -o FILE` and edit that"
        )
    with connect(args) as client:
        response = call(
            client,
            "PUT",
            path("v1", "admin", "tenants", tenant, "policy"),
            content=text.encode(),
            headers={"If-Match": f'"{base}"', "Content-Type": "application/yaml"},
        )
    version = json_of(response)["version"]
    if args.json:
        print(json.dumps({"tenant": tenant, "version": version, "base": base}))
    else:
        print(f"{tenant}: stored as version {version} (made from {base})")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    text, _, tenant = _read(args.file)
    with connect(args) as client:
        stored, etag = _stored(client, tenant)
    version = _number(etag)
    lines = list(
        difflib.unified_diff(
            stored.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"store version {version} of {tenant}",
            str(args.file),
        )
    )
    if args.json:
        report = {"tenant": tenant, "version": version, "differs": bool(lines), "diff": lines}
        print(json.dumps(report))
    else:
        sys.stdout.writelines(lines)
    return 1 if lines else 0


def cmd_history(args: argparse.Namespace) -> int:
    with connect(args) as client:
        response = call(
            client,
            "GET",
            path("v1", "admin", "tenants", args.tenant, "policy", "history"),
            params={"limit": args.limit},
        )
    entries = json_of(response)
    if args.json:
        print(json.dumps(entries))
        return 0
    for entry in entries:
        print(f"{entry['version']:>5}  {entry['written']}  {entry['digest']}  {entry['origin']}")
    return 0
