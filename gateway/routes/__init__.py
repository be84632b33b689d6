"""The endpoints: the proxy, the decision API, escalations, the admin and keys APIs, the
console, the OpenAPI page, readiness and MCP. Each is thin: it reads the edge, calls
the pipeline or the state, and renders the answer."""

from __future__ import annotations

from starlette.requests import Request

from gateway.pipeline.prepare import Gate


def gate_of(request: Request) -> Gate:
    """The worker's Gate, which create_app keeps on the app for every request."""
    gate: Gate = request.app.state.gate
    return gate
