"""`irrev policy validate|show|token|schema|price`: check policy files, summarise one,
issue a token, print the policy file's JSON Schema, price one request; and
`pull|push|diff|history` against the fleet's policy store (policy_store.py)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gateway.edge.canonical import read_request
from gateway.edge.problems import Problem
from gateway.settings import GatewaySettings
from gateway.state.policies import (
    check_demo_tokens,
    check_policy_set,
    is_demo_tokens,
    read_text,
)
from irrev.cli import CliError
from irrev.commands import policy_store
from pricing import (
    TOKEN_BYTES,
    AuthenticatedAgent,
    CompiledRoute,
    EffectClass,
    MemberId,
    PolicyAccount,
    PolicyError,
    Quote,
    Refusal,
    TenantId,
    TenantPolicy,
    ToolName,
    agent_by_id,
    factor_account,
    format_token,
    hash_token,
    load_policy_data,
    money_text,
    parse_yaml,
    policy_accounts,
    policy_schema,
    quote_json,
    quote_lines,
    quote_request,
    round_up,
    with_money_text,
)

EXAMPLE_FACE_MAJOR = 10_000


def configure(policy: argparse.ArgumentParser) -> None:
    commands = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    commands.required = True

    validate = commands.add_parser(
        "validate", help="check policy files; exit 1 listing every problem by field path"
    )
    validate.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="policy files, checked as a set"
    )
    validate.add_argument("--json", action="store_true", help="print the results as JSON")
    validate.set_defaults(func=cmd_validate)

    show = commands.add_parser("show", help="summarise a policy: accounts, agents, routes")
    show.add_argument("file", type=Path, metavar="FILE", help="a policy file")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.set_defaults(func=cmd_show)

    token = commands.add_parser(
        "token",
        help="issue a new agent token (or a tool's settler token); prints it once with the "
        "line for the policy",
    )
    token.add_argument("--tenant", required=True, help="the tenant the token is for")
    holder = token.add_mutually_exclusive_group(required=True)
    holder.add_argument("--agent", help="an agent of the tenant's policy")
    holder.add_argument("--tool", help="the tool API whose settler credential this is")
    holder.add_argument("--admin", help="a tenant admin (its role is set in `admins:`)")
    token.add_argument("--json", action="store_true", help="print the token and its line as JSON")
    token.set_defaults(func=cmd_token)

    schema = commands.add_parser(
        "schema", help="print the JSON Schema of a tenant policy file (for editors)"
    )
    schema.set_defaults(func=cmd_schema)

    price = commands.add_parser(
        "price",
        help="what one request would cost, and why: route, face value, accounts, price, or "
        "the reason code it would be refused with",
    )
    price.add_argument("file", type=Path, metavar="FILE", help="the tenant's policy file")
    target = price.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--route", metavar="'TOOL METHOD PATH'", help="e.g. 'supplier POST /orders'"
    )
    target.add_argument("--tool", help="the tool; with --method and --path")
    price.add_argument("--method", help="with --tool, e.g. POST")
    price.add_argument("--path", help="with --tool: the path under the tool, with any ?query")
    price.add_argument(
        "--body", metavar="JSON|@FILE", help="the JSON request body, or @file to read it"
    )
    price.add_argument(
        "--form", action="store_true", help="the body is a form (name=value&...), not JSON"
    )
    price.add_argument("--agent", help="the agent id: adds its allow-list, cap and accounts")
    price.add_argument("--json", action="store_true", help="print the quote as JSON")
    price.set_defaults(func=cmd_price)

    policy_store.configure(commands)


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise CliError(f"{path}: no such file; pass policy files, e.g. examples/*.yaml")
    return path


def cmd_validate(args: argparse.Namespace) -> int:
    errors: list[PolicyError] = []
    loaded: list[tuple[str, TenantPolicy]] = []
    # The same file named twice (e.g. by overlapping globs) is one file, not two tenants.
    paths = {_existing(p).resolve(): p for p in args.files}
    checked: list[dict[str, object]] = []
    for path in paths.values():
        try:
            data = parse_yaml(read_text(path), str(path))
            if is_demo_tokens(data):
                demo = check_demo_tokens(path)
                demo_file = {"file": str(path), "kind": "demo_tokens", "tenant": demo.tenant}
                checked.append({**demo_file, "agents": len(demo.tokens)})
                if not args.json:
                    print(
                        f"{path}: ok (demo tokens for {len(demo.tokens)} agents of {demo.tenant})"
                    )
                continue
            policy = load_policy_data(data, str(path))
        except PolicyError as exc:
            errors.append(exc)
            continue
        loaded.append((str(path), policy))
        doc = policy.document
        counts = {
            "principals": len(doc.accounts.principals),
            "agents": len(doc.agents),
            "routes": len(doc.routes),
        }
        checked.append({"file": str(path), "kind": "policy", "tenant": policy.tenant, **counts})
        if not args.json:
            print(
                f"{path}: ok (tenant {policy.tenant}: {counts['principals']} principals, "
                f"{counts['agents']} agents, {counts['routes']} routes)"
            )
    # Checked against the settings in force (IRREV_* or defaults), as the gateway will.
    errors += check_policy_set(loaded, _settings().forward_budget())
    if args.json:
        problems = [
            {"file": e.source, "path": p.path, "message": p.message}
            for e in errors
            for p in e.findings
        ]
        print(json.dumps({"ok": not errors, "valid": checked, "problems": problems}, indent=2))
    else:
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
    return money_text(micros, policy.scale, policy.catalog.currency)


def _account_line(policy: TenantPolicy, spec: PolicyAccount, label: str | None = None) -> str:
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
    if args.json:
        print(json.dumps(_show_json(policy), indent=2))
        return 0
    print(
        f"tenant {policy.tenant}: risk unit {policy.document.risk_unit.currency} "
        f"(1 = {policy.scale} minor units); window {_duration(policy.document.window_ms)}; "
        f"hold ttl {_duration(policy.hold_ttl_ms)}; "
        f"escalation ttl {_duration(policy.escalation_ttl_ms)}; "
        f"unknown routes: {policy.document.unknown_routes.action.value}"
    )
    print("accounts:")
    for spec in policy_accounts(policy):
        if not spec.account_id.startswith("agent:"):
            print(_account_line(policy, spec))
    for pattern in policy.document.accounts.risk_factors:
        if pattern.endswith("*"):
            example = factor_account(policy, pattern[:-1] + "x")
            if example is not None:
                print(_account_line(policy, example, f"factor:{pattern} (each)"))
    print(f"agents ({len(policy.document.agents)}):")
    for agent_id, agent in policy.document.agents.items():
        print(
            f"  {agent_id:<20} for {agent.principal:<16} per effect "
            f"{_money(policy, agent.per_effect_cap):>16}  per window "
            f"{_money(policy, agent.window_cap):>16}"
        )
    print(f"routes ({len(policy.document.routes)}):")
    for routes in policy.catalog.routes.values():
        for route in routes:
            print(_route_line(policy, route))
    return 0


def _amounts(policy: TenantPolicy, **amounts: int | None) -> dict[str, object]:
    return with_money_text(amounts, policy.scale, policy.catalog.currency)


def _show_json(policy: TenantPolicy) -> dict[str, object]:
    """What `policy show` prints, as data: integer minor units with `_text` amounts."""
    doc = policy.document
    accounts = [
        {
            "account": spec.account_id,
            "soft_band": spec.soft_band,
            **_amounts(
                policy,
                limit=spec.limit_micros,
                approval_threshold=spec.approval_threshold_micros,
            ),
        }
        for spec in policy_accounts(policy)
        if not spec.account_id.startswith("agent:")
    ]
    agents = [
        {
            "agent": agent_id,
            "principal": agent.principal,
            **_amounts(policy, per_effect_cap=agent.per_effect_cap, window_cap=agent.window_cap),
        }
        for agent_id, agent in doc.agents.items()
    ]
    routes = [
        {
            "route": route.route_id,
            "class": route.effect_class.value,
            "model": route.model,
            "loss_factor": route.loss_factor,
            "factors": [f.text for f in route.factors],
            "in_process": route.in_process,
            "shadow": route.index in policy.shadow_routes,
            **_amounts(policy, approval_threshold=route.approval_threshold_micros),
        }
        for routes in policy.catalog.routes.values()
        for route in routes
    ]
    return {
        "tenant": policy.tenant,
        "currency": doc.risk_unit.currency,
        "scale": policy.scale,
        "mode": doc.mode.value,
        "window_ms": doc.window_ms,
        "hold_ttl_ms": policy.hold_ttl_ms,
        "escalation_ttl_ms": policy.escalation_ttl_ms,
        "unknown_routes": doc.unknown_routes.action.value,
        "accounts": accounts,
        "agents": agents,
        "routes": routes,
    }


def cmd_token(args: argparse.Namespace) -> int:
    # The policy's own field types: a name it would refuse gets no token.
    if args.agent:
        holder = ("--agent", MemberId, args.agent)
    elif args.admin:
        holder = ("--admin", MemberId, args.admin)
    else:
        holder = ("--tool", ToolName, args.tool)
    for field, kind, value in (("--tenant", TenantId, args.tenant), holder):
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError:
            raise CliError(f"{field} {value!r} is not a name a policy accepts") from None
    token = format_token(secrets.token_bytes(TOKEN_BYTES))
    if args.agent:
        who, where, field = f"agent {args.agent}", f"agents.{args.agent}", "token_sha256"
    elif args.admin:
        who, where, field = f"admin {args.admin}", f"admins.{args.admin}", "token_sha256"
    else:
        # Held by the tool API, never by an agent: it settles the tool's holds.
        who, where = f"the settler of tool {args.tool}", f"tools.{args.tool}"
        field = "settler_token_sha256"
    if args.json:
        line = {"tenant": args.tenant, "holder": who, "under": where, "field": field}
        print(json.dumps({**line, "token": token, "hash": hash_token(token)}, indent=2))
        return 0
    print(f"token for {who} of tenant {args.tenant} (shown once; store it now):")
    print(f"  {token}")
    print(f"paste under {where} in the tenant's policy:")
    print(f'  {field}: "{hash_token(token)}"')
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(policy_schema(), indent=2))
    return 0


def _request_of(args: argparse.Namespace) -> tuple[str, str, str]:
    if args.route is not None:
        if args.method or args.path:
            raise CliError("--route names the method and path; drop --method and --path")
        parts = args.route.split()
        if len(parts) != 3:
            raise CliError(f"--route {args.route!r} must be 'TOOL METHOD PATH'")
        return parts[0], parts[1], parts[2]
    if not args.method or not args.path:
        raise CliError("--tool needs --method and --path, e.g. --method POST --path /orders")
    return args.tool, args.method, args.path


def _body_of(text: str | None) -> bytes:
    if text is None:
        return b""
    if text.startswith("@"):
        text = read_text(_existing(Path(text[1:])))
    return text.encode()


def _quote(
    args: argparse.Namespace, policy: TenantPolicy, agent: AuthenticatedAgent | None
) -> Quote:
    tool, method, target = _request_of(args)
    path, _, query = target.partition("?")
    body = _body_of(args.body)
    content_type = "application/x-www-form-urlencoded" if args.form else "application/json"
    try:
        # Read exactly as the proxy reads a request: what it would refuse is refused here.
        canonical = read_request(query, [content_type] if body else [], body)
    except Problem as problem:
        refusal = Refusal(problem.status, problem.reason, problem.detail)
        return Quote(
            tool=tool,
            method=method.upper(),
            path=path,
            effect=None,
            agent_id=args.agent,
            refusal=refusal,
        )
    return quote_request(
        policy,
        tool,
        method,
        path,
        canonical.query_map,
        canonical.document,
        canonical.body_format,
        agent,
    )


def cmd_price(args: argparse.Namespace) -> int:
    """Exit 0 when the request is priced, 1 when the gateway would refuse it."""
    _request_of(args)  # a usage error before the policy is read
    path = _existing(args.file)
    try:
        policy = load_policy_data(parse_yaml(read_text(path), str(path)), str(path))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    agent = None
    if args.agent is not None:
        agent = agent_by_id(policy, args.agent)
        if agent is None:
            raise CliError(f"--agent {args.agent!r} is not an agent of {path}")
    quote = _quote(args, policy, agent)
    if args.json:
        print(json.dumps(quote_json(policy, quote), indent=2))
    else:
        print("\n".join(quote_lines(policy, quote)))
    return 1 if quote.refusal else 0
