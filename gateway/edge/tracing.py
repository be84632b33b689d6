"""OpenTelemetry tracing, off unless the standard OTEL_* variables ask for it.

On (`OTEL_TRACES_EXPORTER` set to an exporter, or an OTLP endpoint set, and
`OTEL_SDK_DISABLED` not true), each worker traces its requests (FastAPI: a
`traceparent` from the agent is the parent, if it is valid: gateway/edge/tracecontext.py),
its upstream calls (httpx: the tool API
receives a `traceparent` of the same trace) and its Redis commands, and the
admission path adds spans for price, reserve, forward, settle and approval with the
decision, price and hold id as attributes. The exporter, sampler, batching and
resource are the SDK's, read from the standard variables; OTLP goes over HTTP
(http/protobuf), or `console` prints spans.

Off, this module imports neither the SDK nor an instrumentation (the `otel` extra
need not be installed), no tracer provider is set (so FastAPI's own tracing, which
recent versions have, stays off too) and a span is one shared no-op object:
nothing is allocated per request. On, FastAPI leaves server spans to the
instrumentation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import httpx
from fastapi import FastAPI

PREFIX = "irrev."
Attribute = str | int | float | bool | None


class Span(Protocol):
    def set_attribute(self, key: str, value: Any) -> Any: ...


class _NoSpan:
    """What `span` gives while tracing is off."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()
_tracer: Any = None


class TracingError(Exception):
    """OTEL_* variables ask for something this gateway cannot do; says what to change."""


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return exporters.strip().lower() not in ("", "none")
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return any(env.get(name) for name in endpoints)


def span(name: str, **attributes: Attribute) -> AbstractContextManager[Span]:
    """A span named `irrev.<name>`, current within the block, with `irrev.<key>`
    attributes (None values left out); set more with `set(span, ...)`."""
    if _tracer is None:
        return _NO_SPAN
    started: AbstractContextManager[Span] = _tracer.start_as_current_span(
        PREFIX + name, attributes=_attributes(attributes)
    )
    return started


def annotate(target: Span, **attributes: Attribute) -> None:
    if _tracer is None:
        return
    for key, value in _attributes(attributes).items():
        target.set_attribute(key, value)


def _attributes(attributes: Mapping[str, Attribute]) -> dict[str, str | int | float | bool]:
    """Enum members (decision, reason, fate) as their plain values."""
    return {
        PREFIX + key: value if isinstance(value, bool | int | float) else str(value)
        for key, value in attributes.items()
        if value is not None
    }


class Tracing:
    """A worker's tracing: `client` instruments the upstream client once it exists,
    `shutdown` flushes the spans not yet exported. Both do nothing while it is off."""

    def __init__(self, provider: Any = None) -> None:
        self.provider = provider

    def client(self, client: httpx.AsyncClient) -> None:
        if self.provider is not None:
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

            HTTPXClientInstrumentor().instrument_client(client, tracer_provider=self.provider)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def setup(app: FastAPI, env: Mapping[str, str] = os.environ) -> Tracing:
    """Trace this worker if the environment asks for it: instruments `app` (before it
    starts) and Redis. Raises TracingError for a request it cannot honour."""
    global _tracer
    if not wanted(env):
        return Tracing()
    try:
        from opentelemetry import propagate, trace
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.instrumentation.redis import RedisInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from gateway.edge.tracepropagation import CheckedPropagator
    except ImportError as exc:
        raise TracingError(
            f"OTEL_* variables turn tracing on, but {exc.name} is not installed: "
            "pip install 'irrev[otel]', or unset them"
        ) from exc
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "irrev-gateway"}))
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    # An agent's trace context is the parent of the gateway's spans only if it is valid.
    propagate.set_global_textmap(CheckedPropagator(propagate.get_global_textmap()))
    _tracer = provider.get_tracer("irrev.gateway")
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, exclude_spans=["receive", "send"]
    )
    RedisInstrumentor().instrument(tracer_provider=provider)
    return Tracing(provider)


def _exporters(env: Mapping[str, str]) -> list[Any]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[Any] = []
    for name in filter(None, names):
        if name == "otlp":
            protocol = env.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            )
            if protocol != "http/protobuf":
                raise TracingError(
                    f"OTLP protocol {protocol!r} is not supported: set "
                    "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (collectors listen on :4318)"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            raise TracingError(
                f"OTEL_TRACES_EXPORTER {name!r} is not one this gateway has: otlp, console or none"
            )
    return exporters
