"""The propagators OpenTelemetry reads an incoming request's trace context with, as the
gateway runs them: the configured ones (OTEL_PROPAGATORS), shown the trace context
only as gateway/edge/tracecontext.py leaves it, so one that is not valid is never made the
parent of the gateway's spans (OpenTelemetry itself took the first of two
traceparents, and a later version's with up to 512 characters of fields it does not
know). Imported by tracing.setup only while tracing is on: it needs the SDK's API."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)

from gateway.edge.tracecontext import TRACEPARENT, TRACESTATE, checked


class _Checked(Getter[CarrierT]):
    """`inner`, but for the trace context, which it gives as `checked` leaves it."""

    def __init__(self, inner: Getter[CarrierT]) -> None:
        self.inner = inner

    def get(self, carrier: CarrierT, key: str) -> list[str] | None:
        name = key.lower()
        if name not in (TRACEPARENT, TRACESTATE):
            return self.inner.get(carrier, key)
        sent = [
            (header, value)
            for header in (TRACEPARENT, TRACESTATE)
            for value in self.inner.get(carrier, header) or []
        ]
        kept = [value for header, value in checked(sent) if header == name]
        return kept or None

    def keys(self, carrier: CarrierT) -> list[str]:
        return self.inner.keys(carrier)


class CheckedPropagator(TextMapPropagator):
    """`inner` (the global propagator), extracting through `_Checked`; what it injects
    into the gateway's own requests is its own, and unchanged."""

    def __init__(self, inner: TextMapPropagator) -> None:
        self.inner = inner

    def extract(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> Context:
        return self.inner.extract(carrier, context, getter=_Checked(getter))

    def inject(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        self.inner.inject(carrier, context, setter=setter)

    @property
    def fields(self) -> set[str]:
        return self.inner.fields
