"""The compiled route catalog and `price_in_catalog`: request -> priced effect, in minor units.

Everything that can be decided from the policy document alone (templates, loss
factors, which factor account caps which factor) is decided once in `compile_catalog`;
a request then costs a dict lookup, a few segment comparisons and one exact integer
rounding.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from ledger.limits import MAX_ID_CHARS
from pricing.calibration import Evidence, Pooling, route_pooling
from pricing.errors import (
    AmbiguousField,
    AmountError,
    BadAmount,
    BadQuery,
    BadRiskFactor,
    CurrencyMismatch,
    RequestError,
    RouteAlias,
    UndeclaredField,
    UndeclaredQueryParameter,
    UnknownRoute,
    UnsupportedBodyFormat,
)
from pricing.models import FACE_MODEL, FREE_MODEL, FacePricing, QuantilePricing
from pricing.money import MAX_MICROS, minor_to_major_text, product_to_minor, round_up, to_decimal
from pricing.policy import (
    DEFAULT_FORWARD_HEADERS,
    BodyFormat,
    EffectClass,
    Keyless,
    PolicyDocument,
    Route,
    UnknownRouteAction,
)
from pricing.templates import (
    CALL,
    FORMAT_EXTENSION,
    ID_RE,
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

Query = Mapping[str, str | Sequence[str]]
FACTOR_PREFIX = "factor:"
# Defaults of a route's `dedupe_window` and (CALL routes) `escalation_wait`: an
# identical keyless call within ten minutes of the first's settling is a repeat (a model
# told "waits for a human" asks again within minutes); a host waits twenty seconds for
# an approval, well inside the 60 s most MCP clients give a request.
DEDUPE_WINDOW_MS = 10 * 60_000
ESCALATION_WAIT_MS = 20_000
# Segments an upstream may normalise into another route than the one that was priced.
_DIGITS = re.compile(r"[0-9]+")
# A whole value a number parser reads as one number (sign, point, exponent; lower-case).
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?")
_UNSAFE_SEGMENTS = frozenset({"", ".", ".."})
# Unicode categories a reader does not see as such: controls, formatting (bidi
# overrides, zero-width characters), line and paragraph separators.
_UNSHOWN = frozenset({"Cc", "Cf", "Zl", "Zp"})
_UNSAFE_ESCAPES = ("%2f", "%5c", "%2e", "\\")
MEDIA_TYPES = {
    BodyFormat.JSON: "application/json",
    BodyFormat.FORM: "application/x-www-form-urlencoded",
}


@dataclass(frozen=True, slots=True)
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

    @property
    def route_id(self) -> str:
        return f"{self.tool} {self.method} {self.template.text}"


@dataclass(frozen=True, slots=True)
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

    @property
    def route_id(self) -> str:
        """The one route id (holds, prices learned, settlers' tools derive from it): a
        listed route's template, or, for an unknown route, its very path, so that one
        Idempotency-Key sent to two unknown paths names two effects, not one."""
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


@dataclass(frozen=True, slots=True)
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


def check_request_path(path: str) -> None:
    """Refuse paths an upstream could normalise into a route other than the one priced."""
    # Tomcat and Spring drop ';params' from a segment before resolving it: '..;' is '..'.
    parts = [p.partition(";")[0] for p in split_path(path)]
    lowered = path.lower()
    if any(p in _UNSAFE_SEGMENTS for p in parts) or any(e in lowered for e in _UNSAFE_ESCAPES):
        raise RequestError(
            f"path {path!r} has empty, '.' or '..' segments or an encoded '/', '\\' or '.'; "
            "send the canonical path"
        )
    if any(unicodedata.category(c) in _UNSHOWN for c in path):
        # An unknown route's id is its path, shown to approvers and printed in the
        # journal: a bidi override shows `/stop` for `/\u202epots`, a carriage return
        # and an escape sequence overwrite a terminal's line with a forged entry.
        raise RequestError(
            f"path {path!r} has control or invisible formatting characters; send the "
            "path without them"
        )


def check_effect_path(path: str) -> None:
    """Effects also refuse ';': matrix parameters that some upstreams strip or route by."""
    if ";" in path:
        raise RequestError(f"path {path!r} contains ';'; effect paths take no matrix parameters")


def check_body_format(expected: BodyFormat, got: BodyFormat | None) -> None:
    if got is not None and got is not expected:
        raise UnsupportedBodyFormat(
            f"this route takes {MEDIA_TYPES[expected]} bodies, not {MEDIA_TYPES[got]}"
        )


def check_effect_query(query: Query, declared: frozenset[str]) -> None:
    """An effect forwards only the query parameters its route declares, each once."""
    for name, values in query.items():
        if name not in declared:
            listed = ", ".join(sorted(declared)) or "none"
            raise UndeclaredQueryParameter(
                name, f"is not a query parameter of this route (it declares: {listed})"
            )
        if not isinstance(values, str) and len(values) != 1:
            raise BadQuery(name, f"appears {len(values)} times in the query; send it once")


def check_effect_body(body: object, declared: frozenset[str]) -> None:
    """A route that declares its body fields forwards those only: a field it does not
    declare (at any depth: `a.b` declares `b` inside `a`, and all of `a.b`'s value) is
    refused, not forwarded unpriced. A route that declares none is left as it is."""
    if declared and isinstance(body, Mapping):
        _check_fields(body, "", declared)


def _check_fields(node: Mapping[object, object], prefix: str, declared: frozenset[str]) -> None:
    for key, value in node.items():
        path = f"{prefix}{key}"
        if path in declared:
            continue
        if isinstance(value, Mapping) and any(d.startswith(path + ".") for d in declared):
            _check_fields(value, path + ".", declared)
            continue
        listed = ", ".join(sorted(declared))
        raise UndeclaredField(path, f"is not a field of this route (it declares: {listed})")


class _Fields:
    """Reads named fields from a request's body, query and path parameters."""

    def __init__(
        self,
        body: object,
        query: Query,
        path_params: Mapping[str, str],
        query_fields: frozenset[str],
        tail_param: str | None = None,
    ) -> None:
        self.body = body
        self.query = query
        self.path_params = path_params
        self.query_fields = query_fields
        self.tail_param = tail_param  # the path parameter in the last segment
        self.body_keys = (
            {str(k).casefold() for k in body} if isinstance(body, Mapping) else set[str]()
        )

    def get(self, name: str) -> object:
        """The field's raw value; KeyError if absent; ValueError if ambiguous."""
        folded = name.casefold()
        places = [
            any(p.casefold() == folded for p in self.path_params),
            any(q.casefold() == folded for q in self.query),
            folded.partition(".")[0] in self.body_keys,
        ]
        if sum(places) > 1:
            # An upstream may read the copy that was not priced (Rails merges path,
            # query and body; servlets prefer the query): send each field once.
            raise AmbiguousField(name, "is in more than one of the path, query and body")
        if "." in name and folded in self.body_keys:
            # `{"payment": {"amount": 1}, "payment.amount": 45000}`: priced from the
            # nested one, while lodash's get() and MongoDB's $set read the flat key.
            raise AmbiguousField(name, "is both a key with dots and a nested path in the body")
        if name in self.path_params:
            return self.path_params[name]
        if name in self.query_fields:
            return _single_query_value(self.query, name)
        node = self.body
        for part in name.split("."):
            if not isinstance(node, Mapping):
                raise KeyError(name)
            node = node[part]
        return node


def _single_query_value(query: Query, name: str) -> str:
    value = query[name]
    if isinstance(value, str):
        return value
    values = list(value)
    if len(values) != 1:
        # The upstream may read another copy than the one priced: refuse, do not guess.
        raise ValueError(f"appears {len(values)} times in the query; send it once")
    return values[0]


def read_face_value(
    fields: _Fields, names: tuple[str, ...], scale: int, amount_scale: int = 1
) -> int:
    factors: list[Decimal] = []
    for name in names:
        try:
            raw = fields.get(name)
        except KeyError:
            raise BadAmount(name, "is missing; the face value needs it") from None
        except RequestError:
            raise
        except ValueError as exc:
            raise BadAmount(name, str(exc)) from None
        try:
            factor = to_decimal(raw)
        except AmountError as exc:
            raise BadAmount(name, str(exc)) from None
        if amount_scale != 1 and factor != factor.to_integral_value():
            raise BadAmount(
                name, f"{raw} must be a whole number of 1/{amount_scale} units (minor units)"
            )
        factors.append(factor)
    try:
        return product_to_minor(factors, scale, amount_scale)
    except AmountError as exc:
        raise BadAmount(" * ".join(names), f"face value {exc}") from None


def check_currency(fields: _Fields, name: str, currency: str) -> None:
    try:
        raw = fields.get(name)
    except KeyError:
        raise CurrencyMismatch(
            name, f"is missing; this route's amounts need it ({currency})"
        ) from None
    except RequestError:
        raise
    except ValueError as exc:
        raise CurrencyMismatch(name, str(exc)) from None
    if not isinstance(raw, str) or raw.casefold() != currency.casefold():
        raise CurrencyMismatch(name, f"{raw!r} is not the tenant's risk-unit currency {currency!r}")


def read_factors(fields: _Fields, templates: tuple[FactorTemplate, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for template in templates:
        values = [_factor_value(fields, name) for name in template.fields]
        factor = template.expand(values)
        if not ID_RE.fullmatch(FACTOR_PREFIX + factor):
            raise BadRiskFactor(
                ",".join(template.fields), f"risk factor {factor!r} is longer than 121 characters"
            )
        if factor not in out:
            out.append(factor)
    return tuple(out)


def _factor_value(fields: _Fields, name: str) -> str:
    try:
        raw = fields.get(name)
    except KeyError:
        raise BadRiskFactor(name, "is missing; the route's risk factor needs it") from None
    except RequestError:
        raise
    except ValueError as exc:
        raise BadRiskFactor(name, str(exc)) from None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise BadRiskFactor(name, f"must be a string or an integer, not {type(raw).__name__}")
    if isinstance(raw, int) and abs(raw) > MAX_MICROS:
        # A JSON integer past 2^53 reads as another number in a parser that uses doubles
        # (JavaScript's): 2^60 and 2^60 + 1 would be one supplier upstream and two
        # factor accounts here.
        raise BadRiskFactor(name, f"{raw} is past 2^53 - 1; send an id that long as a string")
    if isinstance(raw, str) and name == fields.tail_param:
        # `/stock/77.json` is item 77 to a router that strips a format extension.
        raw = FORMAT_EXTENSION.sub("", raw)
    # Case-folded so that 'Acme-Steel' and 'acme-steel' share one factor account, and a
    # number spelled one way only, so that '042', '42.0' and '4.2e1' do (an API that
    # reads ids as numbers reads one customer): an agent must not dodge a concentration
    # cap by spelling; merging only tightens.
    value = _one_spelling(name, str(raw).strip().lower())
    if not ID_RE.fullmatch(value):
        raise BadRiskFactor(name, f"{raw!r} may use only letters, digits and . _ : @ / -")
    return value


def _one_spelling(name: str, value: str) -> str:
    """A factor value that reads as one number, as that number's plain decimal: digits
    without leading zeros, a point only before a fraction's digits; anything else as
    it is."""
    if _DIGITS.fullmatch(value):
        return value.lstrip("0") or "0"  # any length: a long id of digits stays one
    if not _NUMBER.fullmatch(value):
        return value
    number = Decimal(value)
    if number.is_zero():
        return "0"
    # Past an id's length its digits cannot be an id, and printing 1e999999 in full
    # would cost the gateway.
    if not -MAX_ID_CHARS <= number.adjusted() <= MAX_ID_CHARS:
        raise BadRiskFactor(name, f"{value!r} is a number too large or too small for an id")
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


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
    lenient = catalog.lenient_route(tool, method, path)
    if lenient is not None and lenient is not route:
        # A parameter segment took what a lenient router reads as a listed literal:
        # priced as `/reports/{name}` (a read), run as `/reports/export`.
        raise RouteAlias(
            f"{method} {path} matches the listed {route.method} {route.template.text}, but "
            f"lenient routers read it as the listed {lenient.method} "
            f"{lenient.template.text}; send the listed path"
        )
    check_body_format(route.body_format, body_format)
    if route.effect_class is EffectClass.READ:
        return PricedEffect(
            tool, method, path, route, route.effect_class, 0, (), 0, route.model, None, params
        )
    check_effect_path(path)
    check_effect_query(query, route.query_fields)
    fields = _Fields(body, query, params, route.query_fields, route.template.tail_param)
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
    fields = _Fields(body, query, {}, frozenset())
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
