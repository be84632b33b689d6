"""`/docs` and `/openapi.json`: Swagger UI served from the gateway itself (the assets
of the swagger-ui-bundle-v2 package, not a CDN, so the page works without internet;
only the three the page loads, under a Content-Security-Policy like the console's, on
whose origin it is),
and an OpenAPI document that says what FastAPI cannot infer: the Bearer scheme every
API route takes, the Idempotency-Key of effect routes (the proxy's included, which
FastAPI does not list), and problem+json (RFC 9457) as every refusal's body."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, Response
from swagger_ui_bundle import swagger_ui_path

from gateway.edge.problems import PROBLEM_JSON, Problem
from gateway.routes.console import HEADERS

ASSETS = "/docs/assets"
_STATIC = files("gateway").joinpath("static")
# name -> (file, media type): the only files /docs/assets serves (the package's others,
# such as its demo index.html that loads petstore.swagger.io, are not this page's).
_ASSET_FILES = {
    "swagger-ui-bundle.js": (Path(swagger_ui_path) / "swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": (Path(swagger_ui_path) / "swagger-ui.css", "text/css"),
    "favicon-32x32.png": (Path(swagger_ui_path) / "favicon-32x32.png", "image/png"),
    "docs.js": (Path(str(_STATIC.joinpath("docs.js"))), "text/javascript"),
}
# The console's policy, but Swagger UI sets style attributes and draws its icons from
# data: URLs.
DOCS_HEADERS = {
    **HEADERS,
    "Content-Security-Policy": "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    ),
}
BEARER = "bearer"
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A refusal (RFC 9457); `reason` is one of the codes in docs/policy.md, "
    "and a budget refusal adds the numbers that decided it (price, limit, available).",
    "required": ["type", "title", "status", "reason", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "reason": {"type": "string"},
        "detail": {"type": "string"},
        "hold": {"type": "string"},
    },
    "additionalProperties": True,
}
IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "description": "The same key for every retry of one effect, a new key for a new effect "
    "(1-255 printable ASCII); a repeat gets the first decision back and never debits twice.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
}
EFFECT_METHODS = ("post", "put", "patch", "delete")
# The proxy route is left out of FastAPI's schema (one handler for every method and
# path); this is what it takes and answers.
PROXY_PATH = "/tools/{tool}/{path}"


def _proxy_operation(method: str) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": "tool", "in": "path", "required": True, "schema": {"type": "string"}},
        {
            "name": "path",
            "in": "path",
            "required": True,
            "description": "the tool API's path, matched against the tenant's route catalog",
            "schema": {"type": "string"},
        },
    ]
    if method in EFFECT_METHODS:
        parameters.append(IDEMPOTENCY_KEY)
    return {
        "tags": ["proxy"],
        "summary": f"{method.upper()} to a tool API through the gateway",
        "description": "Priced, reserved and forwarded (reads are free and not held). "
        "The tool API's answer comes back with X-Irrev-* budget headers; 202 is an "
        "escalation to poll; a refusal is problem+json.",
        "operationId": f"proxy_{method}",
        "parameters": parameters,
        "responses": {
            "200": {"description": "the tool API's answer"},
            "202": {"description": "escalated: poll the Location for a human's decision"},
        },
    }


def _with_problems(operation: dict[str, Any], secured: bool) -> None:
    responses = operation.setdefault("responses", {})
    # The schema's own 422 is FastAPI's validation body; the gateway answers problem+json.
    responses.pop("422", None)
    for codes, description in (("4XX", "refused"), ("5XX", "not admitted: nothing was done")):
        content = {PROBLEM_JSON: {"schema": PROBLEM_REF}}
        responses[codes] = {"description": description, "content": content}
    if secured:
        operation["security"] = [{BEARER: []}]


def document(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    paths: dict[str, dict[str, Any]] = schema.setdefault("paths", {})
    paths[PROXY_PATH] = {m: _proxy_operation(m) for m in ("get", *EFFECT_METHODS)}
    for path, operations in paths.items():
        for method, operation in operations.items():
            api = path.startswith(("/v1/", "/tools/"))
            _with_problems(operation, secured=api)
            if path == "/v1/holds" and method == "post":
                operation.setdefault("parameters", []).append(IDEMPOTENCY_KEY)
            if path == "/metrics":
                # Optional: an admin token adds tenant labels.
                operation["security"] = [{}, {BEARER: []}]
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    for unused in ("HTTPValidationError", "ValidationError"):
        components["schemas"].pop(unused, None)
    components["securitySchemes"] = {
        BEARER: {
            "type": "http",
            "scheme": "bearer",
            "description": "an agent's token (effects, its holds), a tool's settler token, "
            "a tenant admin's or an operator's (IRREV_ADMIN_TOKENS) token",
        }
    }
    return schema


def install(app: FastAPI) -> None:
    """Serve /docs from local assets and /openapi.json as `document` builds it (once)."""
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not built:
            built.update(document(app))
        return built

    app.openapi = openapi  # type: ignore[method-assign]
    page = _STATIC.joinpath("docs.html").read_bytes()

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=DOCS_HEADERS)

    @app.get(ASSETS + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        found = _ASSET_FILES.get(name)
        if found is None:
            raise Problem(404, "not_found", f"no file {name!r} in /docs")
        path, media_type = found
        return FileResponse(path, media_type=media_type, headers=DOCS_HEADERS)
