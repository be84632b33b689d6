"""Cross-field checks of a parsed policy; each finding names its field path.

Pydantic checks each field on its own; what needs two fields at once (an agent's
principal exists, a face-value field is declared, no two routes collide) is here.
"""

from __future__ import annotations

from ledger.limits import MAX_ACCOUNTS
from pricing.errors import Finding
from pricing.headers import (
    FRAMING,
    GATEWAY_HEADER_PREFIXES,
    HOP_BY_HOP,
    NEVER_FORWARDED,
    NEVER_RETURNED,
)
from pricing.models import FacePricing
from pricing.policy import (
    BodyFormat,
    EffectClass,
    Keyless,
    PolicyDocument,
    Route,
    SecretSource,
    Tool,
    UnknownRouteAction,
)
from pricing.scopes import ANY, parse_scope
from pricing.templates import (
    CALL,
    TemplateError,
    parse_call,
    parse_factor,
    parse_lookup,
    parse_product,
    parse_route,
)

# Every hold debits the tenant, the principal and the agent; factors take the rest.
MAX_ROUTE_FACTORS = MAX_ACCOUNTS - 3
# A credential may be any header but these: they frame the request or are the gateway's.
NEVER_INJECTED = HOP_BY_HOP | FRAMING


# The ledger keeps a stress detector's tick to at most a day (ledger/lua/detector.lua).
DAY_MS = 86_400_000


def check_policy(policy: PolicyDocument) -> list[Finding]:
    findings = _check_agents(policy) + _check_settlers(policy)
    findings += _check_admins(policy)
    findings += _check_scopes(policy)
    for name, tool in policy.tools.items():
        findings += _check_tool_kind(f"tools.{name}", tool)
        findings += _check_tool_headers(f"tools.{name}", tool)
        if tool.is_mcp and "__" in name:
            # Agents see `<server>__<tool>`: the first '__' must end the server's name.
            findings.append(Finding(f"tools.{name}", "an MCP server's name must not contain '__'"))
    seen: dict[tuple[str, str, str], int] = {}
    for i, route in enumerate(policy.routes):
        findings += _check_route(policy, i, route, seen)
    findings += _check_unknown_routes(policy)
    if policy.webhook is not None:
        findings += _check_secret("webhook.secret", policy.webhook.secret)
    return findings


def _check_agents(policy: PolicyDocument) -> list[Finding]:
    findings: list[Finding] = []
    owners: dict[str, str] = {}
    for agent_id, agent in policy.agents.items():
        where = f"agents.{agent_id}"
        if agent.principal not in policy.accounts.principals:
            findings.append(
                Finding(
                    f"{where}.principal",
                    f"principal {agent.principal!r} is not defined; add it under "
                    "accounts.principals or fix the name",
                )
            )
        if agent.token_sha256 is not None and agent.token_sha256 in owners:
            findings.append(
                Finding(
                    f"{where}.token_sha256",
                    f"same token hash as agent {owners[agent.token_sha256]!r}; issue each agent "
                    "its own token with 'irrev policy token'",
                )
            )
        if agent.token_sha256 is not None:
            owners.setdefault(agent.token_sha256, agent_id)
        if agent.per_effect_cap > agent.window_cap:
            findings.append(
                Finding(
                    f"{where}.per_effect_cap",
                    "is above the agent's window_cap, so it could never be reached; lower it",
                )
            )
    return findings


def _check_admins(policy: PolicyDocument) -> list[Finding]:
    findings = []
    owners = {
        agent.token_sha256: f"agent {agent_id!r}"
        for agent_id, agent in policy.agents.items()
        if agent.token_sha256 is not None
    }
    for admin_id, admin in policy.admins.items():
        if admin.token_sha256 in owners:
            findings.append(
                Finding(
                    f"admins.{admin_id}.token_sha256",
                    f"same token hash as {owners[admin.token_sha256]}; issue each admin its "
                    "own token with 'irrev policy token'",
                )
            )
        owners.setdefault(admin.token_sha256, f"admin {admin_id!r}")
    return findings


def _check_scopes(policy: PolicyDocument) -> list[Finding]:
    routes = set()
    for route in policy.routes:
        try:
            method, template = parse_route(route.route)
        except TemplateError:
            continue  # reported with the route
        routes.add((route.tool, method, template.shape))
    lists = [(f"agents.{a}.routes", spec.routes) for a, spec in policy.agents.items()]
    lists += [
        (f"accounts.principals.{p}.routes", spec.routes)
        for p, spec in policy.accounts.principals.items()
    ]
    findings = []
    for where, texts in lists:
        for i, text in enumerate(texts or []):
            try:
                tool, method, shape = parse_scope(text)
            except TemplateError as exc:
                findings.append(Finding(f"{where}[{i}]", str(exc)))
                continue
            if tool not in policy.tools:
                findings.append(
                    Finding(f"{where}[{i}]", f"tool {tool!r} is not defined under tools")
                )
            elif method != ANY and (tool, method, shape) not in routes:
                findings.append(
                    Finding(
                        f"{where}[{i}]",
                        f"{text!r} is not a route of the catalog; name a listed route or "
                        f"'{tool} *'",
                    )
                )
    return findings


def _check_secret(where: str, secret: SecretSource) -> list[Finding]:
    if (secret.env is None) == (secret.file is None):
        return [Finding(where, "give exactly one of env (a variable) or file (a path)")]
    if secret.env is not None and secret.env.upper().startswith("IRREV_"):
        return [Finding(where, "IRREV_* variables are the gateway's own settings, never a secret")]
    return []


def _check_tool_kind(where: str, tool: Tool) -> list[Finding]:
    """A tool is an HTTP API, an MCP server over HTTP or one over stdio, or none (an
    in-process tool); each kind's own fields only on that kind."""
    kinds = [tool.upstream, tool.mcp, tool.mcp_command]
    if sum(kind is not None for kind in kinds) > 1:
        return [
            Finding(
                where,
                "give one of upstream (an HTTP API), mcp (an MCP server's URL) or mcp_command "
                "(the command of a stdio MCP server), not several",
            )
        ]
    findings = []
    if tool.dedupes and not tool.is_mcp:
        findings.append(
            Finding(
                f"{where}.dedupes",
                "only an MCP server (mcp or mcp_command) declares dedupes; HTTP tool APIs "
                "always deduplicate by Idempotency-Key",
            )
        )
    if tool.mcp_command is None:
        findings += [
            Finding(f"{where}.{name}", f"{name} is for a stdio MCP server: set mcp_command too")
            for name, given in (("mcp_env", tool.mcp_env), ("mcp_cwd", tool.mcp_cwd))
            if given
        ]
        return findings
    if tool.credentials:
        findings.append(
            Finding(
                f"{where}.credentials",
                "a stdio MCP server gets no HTTP headers: give its secrets as mcp_env entries "
                "({env: NAME} or {file: /path}), which reach its environment only",
            )
        )
    for name, value in tool.mcp_env.items():
        if isinstance(value, SecretSource):
            findings += _check_secret(f"{where}.mcp_env.{name}", value)
    return findings


def _check_tool_headers(where: str, tool: Tool) -> list[Finding]:
    findings = []
    injected: set[str] = set()
    for name, secret in tool.credentials.items():
        here = f"{where}.credentials.{name}"
        if (secret.env is None) == (secret.file is None):
            findings.append(Finding(here, "give exactly one of env (a variable) or file (a path)"))
        elif secret.env is not None and secret.env.upper().startswith("IRREV_"):
            findings.append(
                Finding(
                    here, "IRREV_* variables are the gateway's own settings, never a credential"
                )
            )
        findings += _refused_name(here, name, NEVER_INJECTED, "the gateway sets it itself")
        if _header_key(name) in injected:
            findings.append(Finding(here, "named twice (header names ignore case, '_' is '-')"))
        injected.add(_header_key(name))
    for kind, names, never in (
        ("forward_headers", tool.forward_headers, NEVER_FORWARDED),
        ("response_headers", tool.response_headers, NEVER_RETURNED),
    ):
        for i, name in enumerate(names):
            here = f"{where}.{kind}[{i}]"
            findings += _refused_name(here, name, never, "it can never be passed through")
            if _header_key(name) in injected:
                findings.append(
                    Finding(here, f"{name!r} is a credential of this tool; it is never passed")
                )
    return findings


def _header_key(name: str) -> str:
    """A header name as CGI-style servers (Rack, PHP-FPM, WSGI) read it: case and '_'
    against '-' do not matter, so `X_HTTP_Method_Override` is the method override."""
    return name.lower().replace("_", "-")


def _refused_name(where: str, name: str, never: frozenset[str], why: str) -> list[Finding]:
    key = _header_key(name)
    if key in never or key.startswith(GATEWAY_HEADER_PREFIXES):
        return [Finding(where, f"header {name!r} is not allowed here: {why}")]
    return []


def _check_settlers(policy: PolicyDocument) -> list[Finding]:
    """A settler token is a credential of its own: one that also opened an agent (or
    another tool) would let that caller settle as someone it is not."""
    findings: list[Finding] = []
    owners = {
        agent.token_sha256: f"agent {agent_id!r}"
        for agent_id, agent in policy.agents.items()
        if agent.token_sha256 is not None
    }
    for name, tool in policy.tools.items():
        token = tool.settler_token_sha256
        if token is None:
            continue
        if token in owners:
            findings.append(
                Finding(
                    f"tools.{name}.settler_token_sha256",
                    f"same token hash as {owners[token]}; issue the tool its own settler token "
                    "with 'irrev policy token --tool'",
                )
            )
        owners.setdefault(token, f"tool {name!r}")
    return findings


def _check_route(
    policy: PolicyDocument, i: int, route: Route, seen: dict[tuple[str, str, str], int]
) -> list[Finding]:
    where = f"routes[{i}]"
    findings: list[Finding] = []
    tool = policy.tools.get(route.tool)
    if tool is None:
        findings.append(Finding(f"{where}.tool", f"tool {route.tool!r} is not defined under tools"))
    elif tool.upstream is None and not tool.is_mcp and not route.in_process:
        findings.append(
            Finding(
                f"{where}.tool",
                f"tool {route.tool!r} has no upstream; set tools.{route.tool}.upstream or mark "
                "the route in_process: true",
            )
        )
    try:
        method, template = parse_route(route.route)
    except TemplateError as exc:
        return [*findings, Finding(f"{where}.route", str(exc))]
    if tool is not None:
        findings += _check_mcp_route(where, route, tool, method == CALL)
    key = (route.tool, method, template.shape)
    if key in seen:
        findings.append(
            Finding(
                f"{where}.route",
                f"duplicate route: {route.tool} {route.route} matches the same requests as "
                f"routes[{seen[key]}]; remove or merge one",
            )
        )
    seen.setdefault(key, i)
    if route.overrun_report and not route.in_process:
        findings.append(
            Finding(
                f"{where}.overrun_report",
                "only agents of in-process routes report what an effect cost; a proxied "
                "route's holds are settled by the gateway and the tool's settler",
            )
        )
    findings += _check_keyless(where, route, method == CALL)
    findings += _check_stress(where, route)
    declared = _check_declared_fields(where, route, set(template.params), findings)
    if route.effect_class is EffectClass.READ:
        return findings + _check_read(where, route)
    findings += _check_face_value(where, route, declared)
    findings += _check_factors(policy, where, route, declared)
    if route.effect_class is EffectClass.IRREVERSIBLE and not isinstance(
        route.pricing or FacePricing(), FacePricing
    ):
        findings.append(
            Finding(
                f"{where}.pricing.model",
                "irreversible effects cannot be compensated, so they price at face value; "
                "use model 'face' or class 'compensable' to model recovery",
            )
        )
    if route.lookup is not None:
        findings += _check_lookup(where, route, set(template.params))
    return findings


def _check_stress(where: str, route: Route) -> list[Finding]:
    stress = route.stress
    if stress is None:
        return []
    if stress.tick_ms > DAY_MS:
        return [Finding(f"{where}.stress.tick", "a tick is at most 1d")]
    return [
        Finding(f"{where}.stress.{name}", f"{name} must be at least one tick ({stress.tick_ms} ms)")
        for name, ms in (("hold", stress.hold_ms), ("warm_up", stress.warm_up_ms))
        if ms < stress.tick_ms
    ]


def _check_keyless(where: str, route: Route, is_call: bool) -> list[Finding]:
    """A decision-only route's caller keys its own holds (it settles them by id), and
    only an MCP call can wait for a human inside its request."""
    findings = []
    if route.in_process and route.keyless is Keyless.CONTENT:
        findings.append(
            Finding(
                f"{where}.keyless",
                "in-process routes are held by the caller's own Idempotency-Key: "
                "keyless: content is for proxied and MCP routes",
            )
        )
    if route.escalation_wait_ms is not None and not is_call:
        findings.append(
            Finding(
                f"{where}.escalation_wait",
                "only CALL routes (MCP tools) wait for a human inside the call; HTTP agents "
                "poll the escalation's Location",
            )
        )
    return findings


def _check_mcp_route(where: str, route: Route, tool: Tool, is_call: bool) -> list[Finding]:
    """An MCP server's routes are `CALL <server>/<tool>` and price from `arguments`
    (listed under `body:`); nothing else reaches an MCP server, and CALL nothing else."""
    if not is_call:
        if tool.is_mcp:
            return [
                Finding(
                    f"{where}.route",
                    f"tool {route.tool!r} is an MCP server: its routes are "
                    f"'CALL {route.tool}/<tool name>'",
                )
            ]
        if route.is_error is not None:
            return [Finding(f"{where}.is_error", "only CALL routes (MCP tools) take is_error")]
        return []
    server, _ = parse_call(route.route.strip().partition(" ")[2])
    findings = []
    if not tool.is_mcp:
        findings.append(
            Finding(
                f"{where}.route",
                f"CALL routes name an MCP server; set tools.{route.tool}.mcp to its URL or "
                f"tools.{route.tool}.mcp_command to its command",
            )
        )
    if server != route.tool:
        findings.append(
            Finding(
                f"{where}.route", f"names server {server!r}, but the route's tool is {route.tool!r}"
            )
        )
    refused = {
        "query": route.query,
        "in_process": route.in_process,
        "body_format": route.body_format is not BodyFormat.JSON,
    }
    findings += [
        Finding(f"{where}.{name}", "MCP tools take JSON arguments only: list them under body:")
        for name, present in refused.items()
        if present
    ]
    if route.lookup is not None and not route.lookup.strip().startswith(f"{CALL} {server}/"):
        findings.append(
            Finding(
                f"{where}.lookup",
                f"an MCP route's lookup is a tool of the same server: 'CALL {server}/<tool>'",
            )
        )
    return findings


def _check_declared_fields(
    where: str, route: Route, path_params: set[str], findings: list[Finding]
) -> set[str]:
    for name in set(route.body) & set(route.query):
        findings.append(Finding(f"{where}.query", f"field {name!r} is declared in body and query"))
    for name in (set(route.body) | set(route.query)) & path_params:
        findings.append(
            Finding(f"{where}.body", f"field {name!r} is also a path parameter; rename one")
        )
    declared = set(route.body) | set(route.query) | path_params
    folded: dict[str, str] = {}
    for name in sorted(declared):
        # Many parsers match names case-insensitively: two such fields are one to them.
        other = folded.setdefault(name.casefold(), name)
        if other != name:
            findings.append(
                Finding(f"{where}.body", f"fields {other!r} and {name!r} differ only in case")
            )
    return declared


def _check_read(where: str, route: Route) -> list[Finding]:
    extra = [
        name
        for name in (
            "face_value",
            "face_value_fixed",
            "pricing",
            "approval_threshold",
            "lookup",
            "amount_scale",
            "currency_field",
            "stress",
        )
        if getattr(route, name) is not None
    ] + (["risk_factors"] if route.risk_factors else [])
    return [
        Finding(f"{where}.{name}", "read routes are free; remove this field or change the class")
        for name in extra
    ]


def _check_face_value(where: str, route: Route, declared: set[str]) -> list[Finding]:
    if (route.face_value is None) == (route.face_value_fixed is None):
        return [
            Finding(
                f"{where}.face_value",
                f"an effect route ({route.effect_class.value}) needs exactly one of face_value "
                "(e.g. 'quantity * unit_price') or face_value_fixed",
            )
        ]
    findings = []
    if route.currency_field is not None and route.currency_field not in declared:
        findings.append(
            Finding(
                f"{where}.currency_field",
                f"field {route.currency_field!r} is not declared in the route's body, query "
                "or path; list it under body: or query:",
            )
        )
    if route.face_value is None:
        if route.amount_scale is not None:
            findings.append(
                Finding(
                    f"{where}.amount_scale",
                    "scales the face_value fields; a face_value_fixed is already in the "
                    "risk unit, remove amount_scale",
                )
            )
        return findings
    try:
        names = parse_product(route.face_value)
    except TemplateError as exc:
        return [*findings, Finding(f"{where}.face_value", str(exc))]
    return findings + [
        Finding(
            f"{where}.face_value",
            f"field {name!r} is not declared in the route's body, query or path; "
            "list it under body: or query:",
        )
        for name in names
        if name not in declared
    ]


def _check_factors(
    policy: PolicyDocument, where: str, route: Route, declared: set[str]
) -> list[Finding]:
    findings: list[Finding] = []
    if len(route.risk_factors) > MAX_ROUTE_FACTORS:
        findings.append(
            Finding(
                f"{where}.risk_factors",
                f"at most {MAX_ROUTE_FACTORS} risk factors per route (a hold touches at most "
                f"{MAX_ACCOUNTS} accounts)",
            )
        )
    wildcards = [p[:-1] for p in policy.accounts.risk_factors if p.endswith("*")]
    for j, text in enumerate(route.risk_factors):
        here = f"{where}.risk_factors[{j}]"
        try:
            template = parse_factor(text)
        except TemplateError as exc:
            findings.append(Finding(here, str(exc)))
            continue
        for name in template.fields:
            if name not in declared:
                findings.append(
                    Finding(
                        here,
                        f"field {name!r} is not declared in the route's body, query or path; "
                        "list it under body: or query:",
                    )
                )
        covered = template.text if not template.fields else template.prefix
        if not any(covered.startswith(w) for w in wildcards) and (
            template.fields or text not in policy.accounts.risk_factors
        ):
            findings.append(
                Finding(
                    here,
                    f"no accounts.risk_factors pattern caps {text!r}; add one such as "
                    f"'{template.prefix or text}*' so concentration on it is limited",
                )
            )
    return findings


def _check_lookup(where: str, route: Route, path_params: set[str]) -> list[Finding]:
    assert route.lookup is not None
    if route.in_process:
        return [Finding(f"{where}.lookup", "in-process routes have no upstream to look up")]
    try:
        lookup = parse_lookup(route.lookup)
    except TemplateError as exc:
        return [Finding(f"{where}.lookup", str(exc))]
    return [
        Finding(
            f"{where}.lookup", f"placeholder {{{name}}} is neither {{key}} nor a path parameter"
        )
        for name in lookup.placeholders
        if name != "key" and name not in path_params
    ]


def _check_unknown_routes(policy: PolicyDocument) -> list[Finding]:
    unknown = policy.unknown_routes
    if unknown.action is not UnknownRouteAction.PRICE_AS_IRREVERSIBLE:
        return []
    if unknown.face_value is None:
        return [
            Finding(
                "unknown_routes.face_value",
                "price_as_irreversible needs the body field(s) holding the face value, "
                "e.g. face_value: amount",
            )
        ]
    try:
        parse_product(unknown.face_value)
    except TemplateError as exc:
        return [Finding("unknown_routes.face_value", str(exc))]
    return []
