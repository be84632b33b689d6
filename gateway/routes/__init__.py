"""The endpoints: the proxy, the decision API, escalations, the admin and keys APIs, the
console, the OpenAPI page, readiness and MCP. Each is thin: it reads the edge, calls
the pipeline or the state, and renders the answer."""
