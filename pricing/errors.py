"""Typed errors of the pricing package; each message says what was wrong and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a policy: where (`routes[2].face_value`) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(ValueError):
    """A policy document that cannot be used; `problems` lists every fault found."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class AmountError(ValueError):
    """An amount that is not a finite, non-negative number representable in minor units."""


class RequestError(ValueError):
    """A request the catalog cannot price; the gateway answers 4xx, never 5xx.

    `reason` is the problem+json reason code the gateway reports.
    """

    reason = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnknownRoute(RequestError):
    """No route of the tenant's catalog matches and the policy says to fail closed."""

    reason = "unknown_route"


class BadAmount(RequestError):
    """A face-value field is missing, not a number, negative, or too large."""

    reason = "bad_amount"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"field {field!r}: {problem}")


class BadRiskFactor(RequestError):
    """A field that names a risk factor is missing or not a valid identifier."""

    reason = "bad_risk_factor"

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(f"field {field!r}: {problem}")


class PerEffectCapExceeded(RequestError):
    """The effect's face value is above the agent's per-effect cap."""

    reason = "per_effect_cap"

    def __init__(self, agent_id: str, face_value_micros: int, cap_micros: int) -> None:
        self.agent_id = agent_id
        self.face_value_micros = face_value_micros
        self.cap_micros = cap_micros
        super().__init__(
            f"agent {agent_id!r}: face value {face_value_micros} is above its per-effect cap "
            f"{cap_micros} (minor units); split nothing, ask for approval or a higher cap"
        )
