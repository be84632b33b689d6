"""The small declarative languages of a route: path templates, face-value products,
risk-factor templates and reconciliation lookups. Parsed once; never evaluated as code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from pricing.errors import UnknownRoute

ID_CHARS = r"A-Za-z0-9._:@/-"
ID_RE = re.compile(rf"[{ID_CHARS}]{{1,128}}")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SEGMENT_LITERAL = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@%-]+")
_FACTOR_LITERAL = re.compile(rf"[{ID_CHARS}]*")
# Everything from a segment's first '.': Rails' `.:format` takes any characters but
# '/' and '.', Spring's suffix pattern match anything (`/orders.x-y`, `/orders.json.x`).
FORMAT_EXTENSION = re.compile(r"\..*$")
# A risk factor's account: this prefix, then what the route's FactorTemplate expands to.
FACTOR_PREFIX = "factor:"


class TemplateError(ValueError):
    """A route template that cannot be parsed; the message says how to write it."""


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """`/orders/{order_id}`: literal segments and one-segment `{name}` parameters."""

    text: str
    segments: tuple[str | None, ...]  # None marks a parameter segment
    params: tuple[str, ...]

    @property
    def shape(self) -> str:
        """The template with parameter names erased: two routes of one shape collide."""
        return "/" + "/".join("{}" if s is None else s for s in self.segments)

    @property
    def tail_param(self) -> str | None:
        """The parameter that is the last segment, if one is: a lenient router reads
        it without a format extension (Rails' `.:format`, Spring's suffix match)."""
        return self.params[-1] if self.segments and self.segments[-1] is None else None

    @property
    def specificity(self) -> tuple[int, ...]:
        """Sort key: a literal segment beats a parameter at the first place they differ."""
        return tuple(1 if s is None else 0 for s in self.segments)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.segments):
            return None
        values: dict[str, str] = {}
        names = iter(self.params)
        for part, seg in zip(parts, self.segments, strict=True):
            if seg is None:
                values[next(names)] = part
            elif seg != part:
                return None
        return values

    def match_loose(self, parts: list[str]) -> bool:
        """Whether `loose_parts` of a path match, literal segments compared case-folded."""
        if len(parts) != len(self.segments):
            return False
        return all(
            bool(part) if seg is None else seg.casefold() == part
            for part, seg in zip(parts, self.segments, strict=True)
        )


def split_path(path: str) -> list[str]:
    """Segments of a request path; an empty list for `/`. Trailing slashes are not ignored."""
    stripped = path[1:] if path.startswith("/") else path
    return stripped.split("/") if stripped else []


def loose_parts(path: str) -> list[str]:
    """The segments a lenient router sees: case-folded, without ';params', a trailing
    slash or a format extension (Rails' `/orders.json`, Spring's `/orders.any.thing`)."""
    parts = [p.partition(";")[0].casefold() for p in split_path(path)]
    if parts and not parts[-1]:
        parts.pop()
    if parts:
        parts[-1] = FORMAT_EXTENSION.sub("", parts[-1])
    return parts


def parse_path_template(text: str) -> PathTemplate:
    if not text.startswith("/"):
        raise TemplateError(f"path {text!r} must start with '/'")
    if "?" in text or "#" in text:
        raise TemplateError(f"path {text!r} must not contain a query or fragment")
    segments: list[str | None] = []
    params: list[str] = []
    for part in split_path(text):
        m = re.fullmatch(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", part)
        if m:
            if m.group(1) in params:
                raise TemplateError(f"path {text!r} names parameter {m.group(1)!r} twice")
            params.append(m.group(1))
            segments.append(None)
        elif _SEGMENT_LITERAL.fullmatch(part) and "{" not in part and "}" not in part:
            segments.append(part)
        else:
            raise TemplateError(
                f"path {text!r}: segment {part!r} must be a literal or one '{{name}}' parameter"
            )
    return PathTemplate(text, tuple(segments), tuple(params))


CALL = "CALL"
# The MCP specification's tool names (SEP-986): at most 128 of these characters.
MCP_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def parse_call(text: str) -> tuple[str, str]:
    """`github/delete_repository` -> ("github", "delete_repository"): an MCP server of
    the tenant's tools and one of its tools."""
    server, sep, tool = text.strip().partition("/")
    if not sep or not server or not MCP_TOOL_NAME.fullmatch(tool) or tool.strip(".") == "":
        raise TemplateError(
            f"MCP route {text!r} must be 'CALL <server>/<tool>', e.g. "
            "'CALL github/delete_repository' (tool names: letters, digits, _ . -)"
        )
    return server, tool


def parse_route(text: str) -> tuple[str, PathTemplate]:
    """`POST /orders/{order_id}` -> ("POST", template); `CALL github/delete_repository`
    (an MCP tool) -> ("CALL", the one-segment template `/delete_repository`)."""
    method, sep, path = text.strip().partition(" ")
    if method == CALL and sep:
        _, tool = parse_call(path)
        return CALL, PathTemplate(f"/{tool}", (tool,), ())
    if not sep:
        raise TemplateError(f"route {text!r} must be 'METHOD /path', e.g. 'POST /orders'")
    if method not in METHODS:
        raise TemplateError(f"route {text!r}: method must be one of {', '.join(sorted(METHODS))}")
    return method, parse_path_template(path.strip())


def call_route(server: str, tool: str) -> tuple[str, str]:
    """The operation and target of a call to MCP tool `tool` of server `server`, as
    the policy's `CALL <server>/<tool>` route reads them: what the catalog matches, a
    hold's fingerprint reads and its request keeps."""
    try:
        operation, template = parse_route(f"{CALL} {server}/{tool}")
    except TemplateError:
        raise UnknownRoute(
            f"{tool!r} is not a tool of MCP server {server!r} in the tenant's catalog "
            "(unknown MCP tools are refused; add a 'CALL' route to the policy)"
        ) from None
    return operation, template.text


def parse_product(text: str) -> tuple[str, ...]:
    """`quantity * unit_price` -> ("quantity", "unit_price"). Field names and `*` only."""
    names = tuple(part.strip() for part in text.split("*"))
    for name in names:
        if not NAME_RE.fullmatch(name):
            raise TemplateError(
                f"face value {text!r}: {name!r} is not a field name; write field names "
                "joined by '*', e.g. 'quantity * unit_price'"
            )
    return names


@dataclass(frozen=True, slots=True)
class FactorTemplate:
    """`supplier:{supplier_id}`: literal text with field placeholders."""

    text: str
    literals: tuple[str, ...]  # len(fields) + 1 pieces around the placeholders
    fields: tuple[str, ...]

    @property
    def prefix(self) -> str:
        return self.literals[0]

    def expand(self, values: list[str]) -> str:
        out = [self.literals[0]]
        for value, literal in zip(values, self.literals[1:], strict=True):
            out += [value, literal]
        return "".join(out)


def parse_factor(text: str) -> FactorTemplate:
    literals: list[str] = []
    fields: list[str] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        literals.append(text[pos : m.start()])
        fields.append(m.group(1).strip())
        pos = m.end()
    literals.append(text[pos:])
    for literal in literals:
        if not _FACTOR_LITERAL.fullmatch(literal):
            raise TemplateError(
                f"risk factor {text!r}: literal text may use only [{ID_CHARS}] and "
                "'{field}' placeholders"
            )
    for name in fields:
        if not NAME_RE.fullmatch(name):
            raise TemplateError(f"risk factor {text!r}: {{{name}}} is not a field name")
    if not fields and not ID_RE.fullmatch(text):
        raise TemplateError(f"risk factor {text!r} is not a valid identifier")
    if ":" not in literals[0]:
        raise TemplateError(
            f"risk factor {text!r} must start with a kind and ':', e.g. 'supplier:{{supplier_id}}'"
        )
    return FactorTemplate(text, tuple(literals), tuple(fields))


@dataclass(frozen=True, slots=True)
class Lookup:
    """How to ask the upstream about an effect by idempotency key (reconciliation)."""

    method: str
    template: str
    placeholders: tuple[str, ...]

    def render(self, key: str, path_params: dict[str, str]) -> tuple[str, str]:
        """(method, path with query), with `{key}` and path parameters percent-encoded."""
        values = {**path_params, "key": key}

        def sub(m: re.Match[str]) -> str:
            return quote(values[m.group(1)], safe="")

        return self.method, _PLACEHOLDER.sub(sub, self.template)


def parse_lookup(text: str) -> Lookup:
    """`GET /orders?idempotency_key={key}`, or for an MCP route `CALL <server>/<tool>`: a
    tool called with `{"idempotency_key": <key>}` that answers `{"found": true|false}`."""
    method, sep, target = text.strip().partition(" ")
    if method == CALL and sep:
        _, tool = parse_call(target)
        return Lookup(CALL, f"/{tool}", ())
    if not sep or method not in {"GET", "HEAD", "POST"}:
        raise TemplateError(
            f"lookup {text!r} must be 'GET /path?query', e.g. 'GET /orders?idempotency_key={{key}}'"
        )
    target = target.strip()
    if not target.startswith("/"):
        raise TemplateError(f"lookup {text!r}: the target must start with '/'")
    names = tuple(m.group(1) for m in _PLACEHOLDER.finditer(target))
    if "key" not in names:
        raise TemplateError(f"lookup {text!r} must contain '{{key}}' (the idempotency key)")
    return Lookup(method, target, names)
