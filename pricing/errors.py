"""Typed errors of the pricing package; each message says what was wrong and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with a policy: where (`routes[2].face_value`) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(ValueError):
    """A policy document that cannot be used; `findings` lists every fault found."""

    def __init__(self, source: str, findings: list[Finding]) -> None:
        self.source = source
        self.findings = findings
        super().__init__("\n".join(f"{source}: {p}" for p in findings))


class AmountError(ValueError):
    """An amount that is not a finite, non-negative number representable in minor units."""


class RequestError(ValueError):
    """A request the catalog cannot price; the gateway answers 4xx, never 5xx.

    `reason` is the problem+json reason code the gateway reports, `status` its HTTP status.
    """

    reason = "bad_request"
    status = 422

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnknownRoute(RequestError):
    """No route of the tenant's catalog matches and the policy says to fail closed."""

    reason = "unknown_route"
    status = 403


class RouteAlias(RequestError):
    """A path that an upstream could route to a listed route (another case, a format
    extension, matrix parameters) while it is priced otherwise: unknown, and priced from
    the agent's own field, or matched by a parameter route, it would bypass that route's
    price."""

    reason = "route_alias"
    status = 403


class _FieldError(RequestError):
    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"field {field!r}: {problem}")


class UndeclaredQueryParameter(_FieldError):
    """A query parameter an effect route does not declare: forwarded, an upstream could
    read it as part of the effect (`_method`, an `amount` beside the body's)."""

    reason = "undeclared_query_parameter"
    status = 400


class UndeclaredField(_FieldError):
    """A body field (an MCP call's argument) that a route declaring its `body:` fields
    does not list: forwarded unpriced, an upstream could read it as part of the effect
    (a second amount, a `force: true`)."""

    reason = "undeclared_field"
    status = 422


class BadQuery(_FieldError):
    """A query parameter of an effect given twice: parsers disagree on which counts."""

    reason = "bad_query"
    status = 400


class AmbiguousField(_FieldError):
    """A priced field present in two places (query and body, path and body): the
    upstream may read the copy that was not priced."""

    reason = "ambiguous_field"
    status = 400


class UnsupportedBodyFormat(RequestError):
    """A body in another format than the route's `body_format`."""

    reason = "unsupported_media_type"
    status = 415


class CurrencyMismatch(_FieldError):
    """The route's currency field names another currency than the tenant's risk unit."""

    reason = "currency_mismatch"


class BadAmount(_FieldError):
    """A face-value field is missing, not a number, negative, or too large."""

    reason = "bad_amount"


class BadRiskFactor(_FieldError):
    """A field that names a risk factor is missing or not a valid identifier."""

    reason = "bad_risk_factor"


class PerEffectCapExceeded(RequestError):
    """The effect's face value is above the agent's per-effect cap."""

    reason = "per_effect_cap"
    status = 403

    def __init__(self, agent_id: str, face_value_micros: int, cap_micros: int) -> None:
        self.agent_id = agent_id
        self.face_value_micros = face_value_micros
        self.cap_micros = cap_micros
        super().__init__(
            f"agent {agent_id!r}: face value {face_value_micros} is above its per-effect cap "
            f"{cap_micros} (minor units); split nothing, ask for approval or a higher cap"
        )
