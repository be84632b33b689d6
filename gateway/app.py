"""The gateway application: `create_app(settings, redis_url)`; `app_from_env` is the
factory uvicorn workers call."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route

from gateway.edge import logs, metrics, problems, tracing
from gateway.edge.bodies import BodyLimit
from gateway.routes import (
    admin_agents,
    admin_ledger,
    admin_policies,
    console,
    escalations,
    holds_api,
    keys_api,
    openapi,
    proxy,
)
from gateway.routes.health import Health
from gateway.routes.mcp_mount import LazyMcp
from gateway.settings import GatewaySettings
from gateway.state import lifecycle


def create_app(settings: GatewaySettings, redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running = await lifecycle.start(settings, redis_url, traced.client)
        app.state.gate = running.gate
        app.state.sweeper = running.sweeper
        try:
            yield
        finally:
            await mcp_endpoint.aclose()
            await running.aclose()
            traced.shutdown()

    app = FastAPI(
        title="irrev gateway",
        description="Fleet-wide irreversibility budget admission controller.",
        version=metrics.build_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    traced = tracing.setup(app)
    openapi.install(app)
    problems.install(app)
    # Inside the request-id middleware, so that a refused body is logged and counted.
    app.add_middleware(
        BodyLimit,
        limit=settings.max_body_bytes,
        policy_limit=settings.max_policy_bytes,
        timeout_s=settings.body_timeout_s,
    )
    app.add_middleware(logs.RequestIdMiddleware)
    mcp_endpoint = LazyMcp()
    # No GET: a stateless endpoint never pushes anything, and a GET event stream would
    # stay open for ever, one file descriptor each, from any agent's token.
    app.router.routes.append(Route("/mcp", mcp_endpoint, methods=["POST", "DELETE"]))
    for module in ROUTERS:
        app.include_router(module.router)
    app.include_router(Health(settings).router())
    return app


ROUTERS = (
    proxy,
    holds_api,
    escalations,
    admin_policies,
    admin_agents,
    admin_ledger,
    keys_api,
    console,
)


def app_from_env() -> FastAPI:
    """For uvicorn workers: settings and the Redis URL from the environment."""
    settings = GatewaySettings()
    url = os.environ.get("IRREV_REDIS_URL")
    if not url:
        raise RuntimeError("IRREV_REDIS_URL must be set for gateway workers (irrev serve sets it)")
    logs.configure(settings.log_level)
    return create_app(settings, url)
