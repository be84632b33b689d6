"""Tracing (issue 14): an agent's `traceparent` is the parent of the gateway's spans,
the upstream receives a `traceparent` of the same trace, and the admission path's
spans (price, reserve, forward, settle, approval) carry decision, price and hold id.
Spans go by OTLP/HTTP, configured by the standard OTEL_* variables, from a real
`irrev serve` to a real HTTP receiver that decodes them; off, no SDK is loaded.

An agent's trace context is checked against W3C Trace Context first (issue 26: 4 KB
of `traceparent` reached the tool): one that is not valid is dropped, neither passed
to the tool nor made the parent of the gateway's spans, and the effect goes ahead."""

from __future__ import annotations

import gzip
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from irrev.harness import free_port
from ledger import cluster_enabled

from .conftest import Gateway, TenantMaker, own_gateway
from .helpers import effect_headers, order
from .servers import BIN, ROOT, Server, Tenant, base_env


@pytest.fixture(scope="module")
def trace_context_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("trace-context")


SPAN_DEADLINE_S = 20.0


class Collector:
    """An OTLP/HTTP trace receiver on loopback: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            collector.spans += [_decoded(span) for span in scope.spans]
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["trace_id"] == trace_id]

    def span_of_hold(self, name: str, hold: str) -> dict[str, Any]:
        """The span `name` whose irrev.hold_id is `hold`, once it has arrived."""
        deadline = time.monotonic() + SPAN_DEADLINE_S
        while True:
            with self.lock:
                found = [
                    s
                    for s in self.spans
                    if s["name"] == name and s["attributes"].get("irrev.hold_id") == hold
                ]
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"no {name} span of hold {hold}"
            time.sleep(0.1)

    def wait_for(self, trace_id: str, names: set[str]) -> dict[str, dict[str, Any]]:
        """The spans of `trace_id` by name, once every one of `names` has arrived."""
        deadline = time.monotonic() + SPAN_DEADLINE_S
        while True:
            spans = {span["name"]: span for span in self.of_trace(trace_id)}
            if names <= spans.keys():
                return spans
            assert time.monotonic() < deadline, f"missing spans {names - spans.keys()}: {spans}"
            time.sleep(0.1)


def _decoded(span: Any) -> dict[str, Any]:
    attributes = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        attributes[kv.key] = getattr(kv.value, kind) if kind else None
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent": span.parent_span_id.hex(),
        "attributes": attributes,
    }


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    receiver = Collector()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PARENT = f"00-{TRACE}-{SPAN}-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
# 32 members of 15 characters: 511 with the commas.
FULL_STATE = ",".join(f"k{n:02d}=vvvvvvvvvvv" for n in range(32))
MEMBERS = [f"k{n}=1" for n in range(33)]
Header = tuple[str, str | bytes]


def as_bytes(headers: list[Header]) -> list[tuple[bytes, bytes]]:
    """Headers as httpx sends them, the value not ASCII among them (its type wants all
    names and values of one kind)."""
    return [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers]


@pytest.mark.parametrize(
    ("sent", "passed"),
    [
        # Valid: passed on as sent (spaces, empty members, two fields, all included).
        ([("traceparent", PARENT)], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", STATE)], [PARENT, STATE]),
        (
            [("traceparent", PARENT), ("tracestate", "rojo=1 , ,congo=2")],
            [PARENT, "rojo=1 , ,congo=2"],
        ),
        ([("traceparent", PARENT), ("tracestate", FULL_STATE)], [PARENT, FULL_STATE]),
        (
            [("traceparent", PARENT), ("tracestate", "a=1"), ("tracestate", "b=2")],
            [PARENT, "a=1", "b=2"],
        ),
        ([("traceparent", PARENT), ("tracestate", "t@sys=x y")], [PARENT, "t@sys=x y"]),
        # A version above 00 in the four fields this one knows.
        ([("traceparent", f"01-{TRACE}-{SPAN}-09")], [f"01-{TRACE}-{SPAN}-09"]),
        # A traceparent that is not valid: dropped, and the tracestate with it.
        ([("traceparent", PARENT + "-" + "a" * 4000), ("tracestate", STATE)], []),
        ([("traceparent", f"00-{TRACE.upper()}-{SPAN}-01")], []),
        ([("traceparent", f"00-{'0' * 32}-{SPAN}-01")], []),
        ([("traceparent", f"00-{TRACE}-{'0' * 16}-01")], []),
        ([("traceparent", f"ff-{TRACE}-{SPAN}-01")], []),
        ([("traceparent", f"0x-{TRACE}-{SPAN}-01")], []),
        ([("traceparent", f"00-{TRACE[1:]}-{SPAN}-01")], []),
        ([("traceparent", f"00_{TRACE}_{SPAN}_01")], []),
        ([("traceparent", f"01-{TRACE}-{SPAN}-01-future")], []),
        ([("traceparent", PARENT), ("traceparent", f"00-{TRACE}-{SPAN}-00")], []),
        ([("traceparent", f"00-{TRACE}-{SPAN}-01".encode().replace(b"a", b"\xe1", 1))], []),
        ([("tracestate", STATE)], []),
        # A tracestate that is not valid: dropped, the traceparent passed on.
        ([("traceparent", PARENT), ("tracestate", ",".join(MEMBERS))], [PARENT]),
        (
            [
                ("traceparent", PARENT),
                ("tracestate", ",".join(MEMBERS[:16])),
                ("tracestate", ",".join(MEMBERS[16:])),
            ],
            [PARENT],
        ),
        ([("traceparent", PARENT), ("tracestate", FULL_STATE + "xx")], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "a=" + "v" * 257)], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "Congo=t61rcWkgMzE")], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "congo=a=b")], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "congo=x ,congo=y")], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "congo")], [PARENT]),
        ([("traceparent", PARENT), ("tracestate", "congo=a\tb")], [PARENT]),
    ],
    ids=[
        "parent",
        "parent-state",
        "state-spaces-empty-members",
        "state-32-members-511-chars",
        "state-two-fields",
        "state-multi-tenant-key",
        "version-01",
        "parent-4kb",
        "parent-upper-hex",
        "trace-id-zero",
        "parent-id-zero",
        "version-ff",
        "version-not-hex",
        "trace-id-short",
        "underscores",
        "version-01-extra-field",
        "parent-twice",
        "parent-not-ascii",
        "state-without-parent",
        "state-33-members",
        "state-33-members-two-fields",
        "state-513-chars",
        "state-value-257",
        "state-key-upper",
        "state-value-equals",
        "state-key-twice",
        "state-no-equals",
        "state-value-tab",
    ],
)
async def test_only_a_valid_trace_context_reaches_the_tool(
    trace_context_tenant: Tenant,
    sent: list[Header],
    passed: list[str],
    gateway: Gateway,
    upstream: httpx.AsyncClient,
) -> None:
    """Tracing off, what the tool receives: an invalid trace context is dropped (the
    tool starts a trace of its own), never a refusal of the effect."""
    tenant = trace_context_tenant
    headers: list[Header] = [*effect_headers(tenant, "buyer-01", secrets.token_hex(8)).items()]
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
        admitted = await http.post(
            "/tools/supplier/orders", json=order(quantity=1), headers=as_bytes([*headers, *sent])
        )
        assert admitted.status_code == 201, admitted.text
        seen = (await upstream.get(f"/_headers/{tenant.id}")).json()
    [received] = [h for h in seen if ["x-irrev-hold", admitted.headers["x-irrev-hold"]] in h]
    assert [v for k, v in received if k in ("traceparent", "tracestate")] == passed


@pytest.fixture(scope="module")
def traced_gateway(
    redis_url: str,
    suppliers: Server,
    collector: Collector,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    """One gateway with tracing on, whose spans go to `collector`, for the module's
    tests (each with a tenant of its own)."""
    root = tmp_path_factory.mktemp("traced")
    with own_gateway(redis_url, suppliers, root, 1, **otel(collector)) as gateway:
        yield gateway


def otel(collector: Collector) -> dict[str, str]:
    """The OTEL_* variables that send a gateway's spans to `collector`."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "irrev-under-test",
    }


async def test_an_invalid_traceparent_is_not_the_parent_of_the_gateways_spans(
    traced_gateway: Gateway, suppliers: Server, collector: Collector
) -> None:
    """Tracing on: two traceparents (W3C: ignore both; OpenTelemetry took the first),
    or a version above 00 with a field this version does not know (OpenTelemetry
    took it, up to 512 characters), made the agent's trace the gateway's. Now the
    gateway starts its own trace, and the tool is sent that one."""
    first, second = secrets.token_hex(16), secrets.token_hex(16)
    cases = {
        "twice": [
            ("traceparent", f"00-{first}-{SPAN}-01"),
            ("traceparent", f"00-{second}-{SPAN}-01"),
        ],
        "extra-field": [("traceparent", f"01-{first}-{SPAN}-01-" + "f" * 400)],
    }
    # A tenant of its own on the module's gateway: its spans and headers are its own.
    gateway, tenant = traced_gateway, traced_gateway.new_tenant("traced")
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
        for key, sent in cases.items():
            headers = [*effect_headers(tenant, "buyer-01", key).items(), *sent]
            admitted = await http.post("/tools/supplier/orders", json=order(), headers=headers)
            assert admitted.status_code == 201, admitted.text
            hold = admitted.headers["x-irrev-hold"]
            reserve = collector.span_of_hold("irrev.reserve", hold)
            assert reserve["trace_id"] not in (first, second), key
            seen = (await http.get(f"{suppliers.url}/_headers/{tenant.id}")).json()
            [received] = [dict(h) for h in seen if ["x-irrev-hold", hold] in h]
            assert received["traceparent"].split("-")[1] == reserve["trace_id"], key


async def test_an_agents_trace_runs_through_the_gateway_to_the_upstream(
    traced_gateway: Gateway, suppliers: Server, collector: Collector, redis_url: str
) -> None:
    # A tenant of its own on the module's gateway: its spans and headers are its own.
    gateway, tenant = traced_gateway, traced_gateway.new_tenant("traced")
    header, trace_id, agent_span = traceparent()
    async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
        admitted = await http.post(
            "/tools/supplier/orders",
            json=order(),
            headers={**effect_headers(tenant, "buyer-01", "t1"), "traceparent": header},
        )
        assert admitted.status_code == 201, admitted.text
        seen = (await http.get(f"{suppliers.url}/_headers/{tenant.id}")).json()
        sent = dict(seen[-1])
        names = {"irrev.price", "irrev.reserve", "irrev.forward", "irrev.settle"}
        spans = collector.wait_for(trace_id, names)

        escalation_header, escalated_trace, _ = traceparent()
        escalated = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=450),
            headers={
                **effect_headers(tenant, "buyer-02", "t2"),
                "traceparent": escalation_header,
            },
        )
        assert escalated.status_code == 202, escalated.text
        approval_header, approval_trace, _ = traceparent()
        approved = await http.post(
            f"{escalated.headers['location']}/approve",
            headers={**gateway.admin, "traceparent": approval_header},
        )
        assert approved.status_code == 201, approved.text
        approval = collector.wait_for(approval_trace, {"irrev.approval", "irrev.forward"})
        reserved = collector.wait_for(escalated_trace, {"irrev.reserve"})

    # The upstream's parent is a span of the gateway, in the agent's trace.
    version, upstream_trace, upstream_parent, _ = sent["traceparent"].split("-")
    assert (version, upstream_trace) == ("00", trace_id)
    assert upstream_parent != agent_span
    assert upstream_parent in {span["span_id"] for span in collector.of_trace(trace_id)}
    # The official instrumentations are on: the upstream call is an httpx client span,
    # and the ledger's Redis commands are spans of the same trace (on a standalone
    # Redis: the Redis instrumentation makes no spans for redis-py's cluster client).
    [parent] = [s for s in collector.of_trace(trace_id) if s["span_id"] == upstream_parent]
    assert {"http.method", "http.request.method"} & parent["attributes"].keys(), parent
    redis_spans = [
        s for s in collector.of_trace(trace_id) if s["attributes"].get("db.system") == "redis"
    ]
    assert redis_spans or cluster_enabled(redis_url)
    # The gateway's server span is the agent's span's child.
    assert agent_span in {span["parent"] for span in collector.of_trace(trace_id)}
    hold = admitted.headers["x-irrev-hold"]
    price = int(admitted.headers["x-irrev-price"])
    reserve = spans["irrev.reserve"]["attributes"]
    assert reserve["irrev.decision"] == "admit" and reserve["irrev.reason"] == "within_budget"
    assert reserve["irrev.hold_id"] == hold and reserve["irrev.price"] == price
    assert (
        reserve["irrev.agent"] == "buyer-01" and reserve["irrev.route"] == "supplier POST /orders"
    )
    assert spans["irrev.price"]["attributes"]["irrev.price"] == price
    assert spans["irrev.forward"]["attributes"]["irrev.fate"] == "delivered"
    assert spans["irrev.forward"]["attributes"]["irrev.hold_id"] == hold
    assert spans["irrev.settle"]["attributes"]["irrev.operation"] == "post"
    # Escalated, then approved by a human in another trace.
    assert reserved["irrev.reserve"]["attributes"]["irrev.decision"] == "escalate"
    decided = approval["irrev.approval"]["attributes"]
    assert decided["irrev.decision"] == "approved" and decided["irrev.admin"] == "operator:ops"
    assert decided["irrev.hold_id"] == escalated.headers["x-irrev-hold"]
    assert decided["irrev.price"] == int(escalated.headers["x-irrev-price"])


def test_tracing_off_loads_no_sdk_and_sets_no_provider() -> None:
    """Off by default: a worker's app is built without the SDK's tracing, the
    instrumentations or an exporter, and with no tracer provider (FastAPI itself
    imports the OpenTelemetry API and traces natively only once a provider is set;
    redis-py imports the SDK's metrics where installed, and uses them only if told)."""
    probe = (
        "import sys\n"
        "from opentelemetry import trace\n"
        "from gateway.app import create_app\n"
        "from gateway.settings import GatewaySettings\n"
        "create_app(GatewaySettings(), 'redis://127.0.0.1:1/0')\n"
        "heavy = ('opentelemetry.sdk.trace', 'opentelemetry.instrumentation', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
        "print(type(trace.get_tracer_provider()).__name__)\n"
    )
    result = subprocess.run(
        [str(BIN / "python"), "-c", probe],
        env=base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "ProxyTracerProvider"]


def test_a_tracing_request_it_cannot_honour_stops_the_start(tmp_path: Path) -> None:
    """OTEL_* asking for gRPC (not installed) is said at start, not ignored."""
    probe = (
        "from gateway.app import create_app\n"
        "from gateway.settings import GatewaySettings\n"
        "create_app(GatewaySettings(), 'redis://127.0.0.1:1/0')\n"
    )
    result = subprocess.run(
        [str(BIN / "python"), "-c", probe],
        env=base_env(
            OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="grpc"
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in result.stderr
