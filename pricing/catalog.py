"""The compiled route catalog and `price_in_catalog`: request -> priced effect, in minor units.

Everything that can be decided from the policy document alone (templates, loss
factors, which factor account caps which factor) is decided once in `compile_catalog`;
a request then costs a dict lookup, a few segment comparisons and one exact integer
rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pricing.calibration import Evidence, Pooling, route_pooling
from pricing.errors import BadAmount, RouteAlias, UnknownRoute
from pricing.headers import DEFAULT_FORWARD_HEADERS
from pricing.models import FACE_MODEL, FREE_MODEL, FacePricing, QuantilePricing
from pricing.money import minor_to_major_text, round_up
from pricing.policy import (
    BodyFormat,
    EffectClass,
    Keyless,
    PolicyDocument,
    Route,
    Stress,
    UnknownRouteAction,
)
from pricing.reading import (
    Query,
    RequestFields,
    check_body_format,
    check_currency,
    check_effect_body,
    check_effect_path,
    check_effect_query,
    check_request_path,
    read_face_value,
    read_factors,
    wire_path,
)
from pricing.templates import (
    CALL,
    FactorTemplate,
    Lookup,
    PathTemplate,
    loose_parts,
    parse_factor,
    parse_lookup,
    parse_product,
    parse_route,
    split_path,
)

# Defaults of a route's `dedupe_window` and (CALL routes) `escalation_wait`: an
# identical keyless call within ten minutes of the first's settling is a repeat (a model
# told "waits for a human" asks again within minutes); a host waits twenty seconds for
# an approval, well inside the 60 s most MCP clients give a request.
DEDUPE_WINDOW_MS = 10 * 60_000
ESCALATION_WAIT_MS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledRoute:
    index: int
    tool: str
    method: str
    template: PathTemplate
    effect_class: EffectClass
    body_fields: frozenset[str]
    query_fields: frozenset[str]
    face_fields: tuple[str, ...]
    face_fixed_micros: int | None
    factors: tuple[FactorTemplate, ...]
    model: str
    loss_factor: float
    approval_threshold_micros: int | None
    lookup: Lookup | None
    in_process: bool
    upstream: str | None
    body_format: BodyFormat = BodyFormat.JSON
    amount_scale: int = 1
    currency_field: str | None = None
    # A calibrating route's price by its holds pending at once (`loss_factor` is its
    # price for one: the hold alone); None for every other route.
    pooling: Pooling | None = None
    # A call without an idempotency key: keyed by its content (`keyless`), and answered
    # as a repeat of an identical call's effect for `dedupe_window_ms` after it settled
    # (0: a new effect each time). docs/policy.md, "Calls without a key".
    keyless: bool = False
    dedupe_window_ms: int = DEDUPE_WINDOW_MS
    # CALL routes: how long a tools/call that escalates waits for the decision.
    escalation_wait_ms: int = 0
    # The route's stress detector (`stressed`), or None.
    stress: Stress | None = None

    @property
    def route_id(self) -> str:
        return f"{self.tool} {self.method} {self.template.text}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PricedEffect:
    """What the gateway reserves: the route's class, the face value and its price.

    `route` is `None` for an unknown route priced as irreversible at face value.
    """

    tool: str
    method: str
    path: str
    route: CompiledRoute | None
    effect_class: EffectClass
    face_value_micros: int
    risk_factors: tuple[str, ...]
    price_micros: int
    model: str
    approval_threshold_micros: int | None
    path_params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def unpriced(
        cls,
        tool: str,
        method: str,
        path: str,
        route: CompiledRoute,
        path_params: dict[str, str] | None = None,
    ) -> PricedEffect:
        """A listed route's effect at no price: a read, or a route as an allow-list
        check reads it (no request)."""
        return cls(
            tool=tool,
            method=method,
            path=path,
            route=route,
            effect_class=route.effect_class,
            face_value_micros=0,
            risk_factors=(),
            price_micros=0,
            model=route.model,
            approval_threshold_micros=None,
            path_params=path_params or {},
        )

    @property
    def route_id(self) -> str:
        """The one route id (holds, prices learned, settlers' tools derive from it): a
        listed route's template, or, for an unknown route, its very path, so that one
        Idempotency-Key sent to two unknown paths names two effects, not one. That path
        as it is sent (percent-encoded): the id is what approvers and webhook receivers
        read, and decoded, a parameter holding `%3F` read as a query the upstream never
        gets (`refunds?dry_run=true` for a real refund)."""
        return (
            self.route.route_id
            if self.route
            else f"{self.tool} {self.method} {wire_path(self.path)}"
        )

    @property
    def hold_route(self) -> str:
        """What a hold's id is derived from (with the agent and its key): the route id,
        but an unknown route's path decoded, as hold ids were derived before the id
        was spelled as sent. Re-spelled, a repeat of a call made before (a retry
        across a rolling upgrade, a key reused within its record's retention) would
        get another hold and be sent again. Decoded paths are as distinct as encoded
        ones, so two unknown paths are still two effects."""
        return self.route.route_id if self.route else f"{self.tool} {self.method} {self.path}"

    @property
    def needs_approval(self) -> bool:
        """A single price above the route's approval threshold escalates."""
        t = self.approval_threshold_micros
        return t is not None and self.price_micros > t

    @property
    def in_process(self) -> bool:
        return self.route.in_process if self.route else False

    @property
    def upstream(self) -> str | None:
        return self.route.upstream if self.route else None

    def lookup_request(self, idempotency_key: str) -> tuple[str, str] | None:
        """(method, path?query) asking the upstream about this effect, if the route says how."""
        if self.route is None or self.route.lookup is None:
            return None
        return self.route.lookup.render(idempotency_key, self.path_params)


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    scale: int
    currency: str
    routes: dict[tuple[str, str], tuple[CompiledRoute, ...]]
    by_tool: dict[str, tuple[CompiledRoute, ...]]
    tool_upstreams: dict[str, str | None]
    credentialed_tools: frozenset[str]
    # Lower-case names of the agent's request headers each tool lets upstream.
    forwarded_headers: dict[str, frozenset[str]]
    unknown_action: UnknownRouteAction
    unknown_face_fields: tuple[str, ...]
    unknown_approval_threshold_micros: int | None
    mcp_tools: frozenset[str] = frozenset()
    # The smallest face value above zero an effect may have (the policy's min_amount).
    min_amount_micros: int = 1

    def match(
        self, tool: str, method: str, path: str
    ) -> tuple[CompiledRoute, dict[str, str]] | None:
        candidates = self.routes.get((tool, method))
        if not candidates:
            return None
        parts = split_path(path)
        for route in candidates:
            params = route.template.match(parts)
            if params is not None:
                return route, params
        return None

    def lenient_route(self, tool: str, method: str, path: str) -> CompiledRoute | None:
        """The listed route of `tool` and `method` a lenient router reads `path` as
        (another case, a format extension, matrix parameters): the most specific one
        whose template matches the path's `loose_parts`."""
        loose = loose_parts(path)
        routes = self.routes.get((tool, method), ())
        return next((route for route in routes if route.template.match_loose(loose)), None)

    def alias_of(self, tool: str, path: str) -> CompiledRoute | None:
        """A listed route of `tool` that `path` (listed under no method) reads as to a
        lenient router: another case, a format extension, matrix parameters."""
        routes = self.by_tool.get(tool, ())
        if any(route.template.match(split_path(path)) is not None for route in routes):
            return None
        loose = loose_parts(path)
        return next((route for route in routes if route.template.match_loose(loose)), None)


def route_pricing(
    route: Route, evidence: Evidence | None = None
) -> tuple[str, float, Pooling | None]:
    """The route's model, loss factor and, for a calibrating route, its pooling: its
    price follows the residual factors its settled holds revealed (`evidence`; none
    yet: the prior's bound) and how many of its holds are open at once (the loss
    factor is its price for a hold alone)."""
    if route.effect_class is EffectClass.READ:
        return FREE_MODEL, 0.0, None
    spec = route.pricing or FacePricing()
    if isinstance(spec, QuantilePricing) and spec.calibrate is not None:
        pooling = route_pooling(spec, evidence or Evidence())
        # `pending: 1` (the default) prices every hold alone: nothing to pool over,
        # and its holds need not be counted.
        return spec.model, pooling.factor(1.0), pooling if pooling.cap > 1 else None
    return spec.model, spec.loss_factor(), None


def _keyless(route: Route, method: str) -> bool:
    """MCP hosts send no key: CALL routes take keyless calls unless told not to."""
    if route.keyless is None:
        return method == CALL and not route.in_process
    return route.keyless is Keyless.CONTENT


def compile_route(
    index: int, route: Route, upstream: str | None, evidence: Evidence | None = None
) -> CompiledRoute:
    method, template = parse_route(route.route)
    model, factor, pooling = route_pricing(route, evidence)
    wait = route.escalation_wait_ms
    return CompiledRoute(
        index=index,
        tool=route.tool,
        method=method,
        template=template,
        effect_class=route.effect_class,
        body_fields=frozenset(route.body),
        query_fields=frozenset(route.query),
        face_fields=parse_product(route.face_value) if route.face_value else (),
        face_fixed_micros=route.face_value_fixed,
        factors=tuple(parse_factor(f) for f in route.risk_factors),
        model=model,
        loss_factor=factor,
        approval_threshold_micros=route.approval_threshold,
        lookup=parse_lookup(route.lookup) if route.lookup else None,
        in_process=route.in_process,
        upstream=upstream,
        body_format=route.body_format,
        amount_scale=route.amount_scale or 1,
        currency_field=route.currency_field,
        pooling=pooling,
        keyless=_keyless(route, method),
        dedupe_window_ms=(
            DEDUPE_WINDOW_MS if route.dedupe_window_ms is None else route.dedupe_window_ms
        ),
        escalation_wait_ms=ESCALATION_WAIT_MS if wait is None and method == CALL else wait or 0,
        stress=route.stress,
    )


def compile_catalog(
    policy: PolicyDocument, evidence: Mapping[str, Evidence] | None = None
) -> Catalog:
    """Compile a validated policy's routes; most specific template first per tool+method.
    `evidence`: settled residual factors by route id, for calibrating routes."""
    grouped: dict[tuple[str, str], list[CompiledRoute]] = {}
    for i, route in enumerate(policy.routes):
        tool = policy.tools.get(route.tool)
        upstream = tool.upstream if tool else None
        compiled = compile_route(i, route, upstream)
        if evidence and compiled.route_id in evidence:
            compiled = compile_route(i, route, upstream, evidence[compiled.route_id])
        grouped.setdefault((compiled.tool, compiled.method), []).append(compiled)
    unknown = policy.unknown_routes
    by_tool: dict[str, list[CompiledRoute]] = {}
    for (tool_name, _), compiled_routes in grouped.items():
        by_tool.setdefault(tool_name, []).extend(compiled_routes)
    return Catalog(
        scale=policy.scale,
        currency=policy.risk_unit.currency,
        routes={
            k: tuple(sorted(v, key=lambda r: r.template.specificity)) for k, v in grouped.items()
        },
        by_tool={k: tuple(v) for k, v in by_tool.items()},
        tool_upstreams={name: t.upstream for name, t in policy.tools.items()},
        credentialed_tools=frozenset(name for name, t in policy.tools.items() if t.credentials),
        forwarded_headers={
            name: DEFAULT_FORWARD_HEADERS | {h.lower() for h in t.forward_headers}
            for name, t in policy.tools.items()
        },
        unknown_action=unknown.action,
        unknown_face_fields=parse_product(unknown.face_value) if unknown.face_value else (),
        unknown_approval_threshold_micros=unknown.approval_threshold,
        min_amount_micros=(
            policy.min_amount if policy.min_amount is not None else max(1, policy.scale // 100)
        ),
        mcp_tools=frozenset(name for name, t in policy.tools.items() if t.is_mcp),
    )


def price_in_catalog(
    catalog: Catalog,
    tool: str,
    method: str,
    path: str,
    query: Query,
    body: object,
    body_format: BodyFormat | None = None,
) -> PricedEffect:
    """Price one request exactly as it will be forwarded.

    `path` is the part after `/tools/{tool}` (e.g. `/orders`), `query` the parsed query
    string, `body` the parsed body (JSON: numbers as int or Decimal; a form: a dict of
    strings) or None, `body_format` how it was encoded (None: no body). Raises a
    `RequestError` subclass (each has a `reason` code) when the request cannot be priced.
    """
    method = method.upper()
    check_request_path(path)
    found = catalog.match(tool, method, path)
    if found is None:
        return _price_unknown(catalog, tool, method, path, query, body, body_format)
    route, params = found
    _check_no_lenient_alias(catalog, route, tool, method, path)
    check_body_format(route.body_format, body_format)
    if route.effect_class is EffectClass.READ:
        return PricedEffect.unpriced(tool, method, path, route, params)
    check_effect_path(path)
    check_effect_query(query, route.query_fields)
    fields = RequestFields(body, query, params, route.query_fields, route.template.tail_param)
    if route.currency_field is not None:
        check_currency(fields, route.currency_field, catalog.currency)
    if route.face_fixed_micros is not None:
        face = route.face_fixed_micros
    else:
        face = read_face_value(fields, route.face_fields, catalog.scale, route.amount_scale)
        check_min_amount(catalog, face, " * ".join(route.face_fields))
    factors = read_factors(fields, route.factors)
    # After the fields are read: a priced field sent twice is `ambiguous_field` first.
    check_effect_body(body, route.body_fields)
    return PricedEffect(
        tool=tool,
        method=method,
        path=path,
        route=route,
        effect_class=route.effect_class,
        face_value_micros=face,
        risk_factors=factors,
        price_micros=round_up(face, route.loss_factor),
        model=route.model,
        approval_threshold_micros=route.approval_threshold_micros,
        path_params=params,
    )


def _check_no_lenient_alias(
    catalog: Catalog, route: CompiledRoute, tool: str, method: str, path: str
) -> None:
    """RouteAlias when a lenient router would read `path`, which matched `route`, as
    another listed route: a parameter segment took what such a router reads as a
    listed literal (priced as `/reports/{name}`, a read, run as `/reports/export`)."""
    lenient = catalog.lenient_route(tool, method, path)
    if lenient is not None and lenient is not route:
        raise RouteAlias(
            f"{method} {path} matches the listed {route.method} {route.template.text}, but "
            f"lenient routers read it as the listed {lenient.method} "
            f"{lenient.template.text}; send the listed path"
        )


def check_min_amount(catalog: Catalog, face_micros: int, fields: str) -> None:
    """BadAmount for a face value above zero but below the tenant's smallest amount:
    a micro-payment costs next to nothing yet opens a risk-factor account per payee
    (issue 26). Zero stays allowed: a free effect holds nothing and opens nothing."""
    if 0 < face_micros < catalog.min_amount_micros:
        smallest = minor_to_major_text(catalog.min_amount_micros, catalog.scale)
        raise BadAmount(
            fields,
            f"{minor_to_major_text(face_micros, catalog.scale)} {catalog.currency} is below "
            f"the smallest amount this organisation prices, {smallest} {catalog.currency}",
        )


def priced_for(effect: PricedEffect, pending: float) -> PricedEffect:
    """`effect` priced with `pending` holds of its route open at once (itself
    included): a calibrating route's price pools their luck (`Pooling`); any other
    effect is returned as it is."""
    pooling = effect.route.pooling if effect.route else None
    if pooling is None:
        return effect
    return replace(effect, price_micros=round_up(effect.face_value_micros, pooling.factor(pending)))


def stressed(effect: PricedEffect) -> PricedEffect:
    """`effect` priced while its route's stress detector is on: its route's stressed
    loss factor of the face value, never below the price it had."""
    stress = effect.route.stress if effect.route else None
    if stress is None:
        return effect
    hot = round_up(effect.face_value_micros, stress.loss_factor)
    return replace(effect, price_micros=max(effect.price_micros, hot))


def _price_unknown(
    catalog: Catalog,
    tool: str,
    method: str,
    path: str,
    query: Query,
    body: object,
    body_format: BodyFormat | None,
) -> PricedEffect:
    if tool not in catalog.tool_upstreams:
        raise UnknownRoute(f"tool {tool!r} is not in the tenant's catalog")
    if tool in catalog.mcp_tools:
        # An MCP server's tools are the ones its routes list: a tool the catalog does
        # not price is never called, whatever the tenant does with unknown HTTP routes.
        raise UnknownRoute(
            f"{path.lstrip('/')!r} is not a tool of MCP server {tool!r} in the tenant's "
            "catalog (unknown MCP tools are refused; add a 'CALL' route to the policy)"
        )
    if catalog.unknown_action is UnknownRouteAction.DENY:
        raise UnknownRoute(
            f"{method} {path} of tool {tool!r} is not in the tenant's route catalog "
            "(unknown routes are denied; add the route to the policy)"
        )
    if tool in catalog.credentialed_tools:
        # An unknown route is priced by the agent's own number: with the gateway's
        # credentials added it would open the whole API (DELETE, exports) at price 0.
        raise UnknownRoute(
            f"{method} {path} is not in the catalog, and tool {tool!r} carries the "
            "gateway's credentials: only its listed routes are forwarded"
        )
    alias = catalog.alias_of(tool, path)
    if alias is not None:
        raise RouteAlias(
            f"{method} {path} is not listed, but lenient routers read it as the listed "
            f"{alias.method} {alias.template.text}; send the listed path"
        )
    check_effect_path(path)
    check_body_format(BodyFormat.JSON, body_format)
    check_effect_query(query, frozenset())
    fields = RequestFields(body, query, {}, frozenset())
    face = read_face_value(fields, catalog.unknown_face_fields, catalog.scale)
    check_min_amount(catalog, face, " * ".join(catalog.unknown_face_fields))
    return PricedEffect(
        tool=tool,
        method=method,
        path=path,
        route=None,
        effect_class=EffectClass.IRREVERSIBLE,
        face_value_micros=face,
        risk_factors=(),
        price_micros=face,
        model=FACE_MODEL,
        approval_threshold_micros=catalog.unknown_approval_threshold_micros,
    )
