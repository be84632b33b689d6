"""`irrev policy validate|show|token`: check policy files, summarise one, issue a token."""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gateway.policies import (
    check_demo_tokens,
    check_policy_set,
    is_demo_tokens,
    read_text,
)
from gateway.settings import GatewaySettings
from irrev.cli import CliError
from pricing import (
    PolicyError,
    TenantPolicy,
    factor_account,
    format_token,
    hash_token,
    load_policy_data,
    minor_to_major_text,
    parse_yaml,
    policy_accounts,
    round_up,
)
from pricing.accounts import AccountSpec
from pricing.catalog import CompiledRoute
from pricing.credentials import TOKEN_BYTES
from pricing.policy import EffectClass, MemberId, TenantId, ToolName

EXAMPLE_FACE_MAJOR = 10_000


def configure(policy: argparse.ArgumentParser) -> None:
    commands = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    commands.required = True

    validate = commands.add_parser(
        "validate", help="check policy files; exit 1 listing every problem by field path"
    )
    validate.add_argument("files", nargs="+", type=Path, metavar="FILE")
    validate.set_defaults(func=cmd_validate)

    show = commands.add_parser("show", help="summarise a policy: accounts, agents, routes")
    show.add_argument("file", type=Path, metavar="FILE")
    show.set_defaults(func=cmd_show)

    token = commands.add_parser(
        "token",
        help="issue a new agent token (or a tool's settler token); prints it once with the "
        "line for the policy",
    )
    token.add_argument("--tenant", required=True)
    holder = token.add_mutually_exclusive_group(required=True)
    holder.add_argument("--agent")
    holder.add_argument("--tool", help="the tool API whose settler credential this is")
    token.set_defaults(func=cmd_token)


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise CliError(f"{path}: no such file; pass policy files, e.g. examples/*.yaml")
    return path


def cmd_validate(args: argparse.Namespace) -> int:
    errors: list[PolicyError] = []
    loaded: list[tuple[str, TenantPolicy]] = []
    # The same file named twice (e.g. by overlapping globs) is one file, not two tenants.
    paths = {_existing(p).resolve(): p for p in args.files}
    for path in paths.values():
        try:
            data = parse_yaml(read_text(path), str(path))
            if is_demo_tokens(data):
                demo = check_demo_tokens(path)
                print(f"{path}: ok (demo tokens for {len(demo.tokens)} agents of {demo.tenant})")
                continue
            policy = load_policy_data(data, str(path))
        except PolicyError as exc:
            errors.append(exc)
            continue
        loaded.append((str(path), policy))
        print(
            f"{path}: ok (tenant {policy.tenant}: {len(policy.accounts.principals)} principals, "
            f"{len(policy.agents)} agents, {len(policy.routes)} routes)"
        )
    # Checked against the settings in force (IRREV_* or defaults), as the gateway will.
    errors += check_policy_set(loaded, _settings().forward_budget())
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


def _settings() -> GatewaySettings:
    try:
        return GatewaySettings()
    except ValidationError as exc:
        raise CliError(f"the IRREV_* settings are not valid:\n{exc}") from exc


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0 and not (unit == "d" and ms <= 2 * 86_400_000):
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _money(policy: TenantPolicy, micros: int | None) -> str:
    if micros is None:
        return "-"
    whole, dot, fraction = minor_to_major_text(micros, policy.scale).partition(".")
    return f"{int(whole):,}{dot}{fraction} {policy.risk_unit.currency}"


def _account_line(policy: TenantPolicy, spec: AccountSpec, label: str | None = None) -> str:
    return (
        f"  {label or spec.account_id:<34} limit {_money(policy, spec.limit_micros):>18}"
        f"  soft band {spec.soft_band:.2f}"
        f"  approval above {_money(policy, spec.approval_threshold_micros)}"
    )


def _route_line(policy: TenantPolicy, route: CompiledRoute) -> str:
    head = f"  {route.route_id:<40} {route.effect_class.value:<12}"
    if route.effect_class is EffectClass.READ:
        return head + " free"
    face = EXAMPLE_FACE_MAJOR * policy.scale
    if route.face_fixed_micros is not None:
        face = route.face_fixed_micros
    source = " * ".join(route.face_fields) or "fixed"
    line = (
        f"{head} {route.model:<9} x{route.loss_factor:.4f} of face = {source}; "
        f"{_money(policy, face)} face costs {_money(policy, round_up(face, route.loss_factor))}"
    )
    if route.factors:
        line += f"; factors {', '.join(f.text for f in route.factors)}"
    if route.approval_threshold_micros is not None:
        line += f"; approval above {_money(policy, route.approval_threshold_micros)}"
    if route.in_process:
        line += "; in-process"
    return line


def cmd_show(args: argparse.Namespace) -> int:
    path = _existing(args.file)
    try:
        policy = load_policy_data(parse_yaml(read_text(path), str(path)), str(path))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"tenant {policy.tenant}: risk unit {policy.risk_unit.currency} "
        f"(1 = {policy.scale} minor units); window {_duration(policy.window_ms)}; "
        f"hold ttl {_duration(policy.hold_ttl_ms)}; "
        f"escalation ttl {_duration(policy.escalation_ttl_ms)}; "
        f"unknown routes: {policy.unknown_routes.action.value}"
    )
    print("accounts:")
    for spec in policy_accounts(policy):
        if not spec.account_id.startswith("agent:"):
            print(_account_line(policy, spec))
    for pattern in policy.accounts.risk_factors:
        if pattern.endswith("*"):
            example = factor_account(policy, pattern[:-1] + "x")
            if example is not None:
                print(_account_line(policy, example, f"factor:{pattern} (each)"))
    print(f"agents ({len(policy.agents)}):")
    for agent_id, agent in policy.agents.items():
        print(
            f"  {agent_id:<20} for {agent.principal:<16} per effect "
            f"{_money(policy, agent.per_effect_cap):>16}  per window "
            f"{_money(policy, agent.window_cap):>16}"
        )
    print(f"routes ({len(policy.routes)}):")
    for routes in policy.catalog.routes.values():
        for route in routes:
            print(_route_line(policy, route))
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    # The policy's own field types: a name it would refuse gets no token.
    holder = ("--agent", MemberId, args.agent) if args.agent else ("--tool", ToolName, args.tool)
    for field, kind, value in (("--tenant", TenantId, args.tenant), holder):
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError:
            raise CliError(f"{field} {value!r} is not a name a policy accepts") from None
    token = format_token(secrets.token_bytes(TOKEN_BYTES))
    if args.agent:
        who, where, field = f"agent {args.agent}", f"agents.{args.agent}", "token_sha256"
    else:
        # Held by the tool API, never by an agent: it settles the tool's holds.
        who, where = f"the settler of tool {args.tool}", f"tools.{args.tool}"
        field = "settler_token_sha256"
    print(f"token for {who} of tenant {args.tenant} (shown once; store it now):")
    print(f"  {token}")
    print(f"paste under {where} in the tenant's policy:")
    print(f'  {field}: "{hash_token(token)}"')
    return 0
