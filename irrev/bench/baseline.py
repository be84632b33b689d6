"""The baseline `irrev bench gateway` compares against: a bare FastAPI endpoint that
makes one Redis call (a trivial EVALSHA) and forwards the request the same way the
gateway does. Run by uvicorn with the same settings as the gateway."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from redis.asyncio import Redis

TRIVIAL = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"


def create_baseline() -> FastAPI:
    redis_url, upstream_url = os.environ["IRREV_REDIS_URL"], os.environ["IRREV_BENCH_UPSTREAM"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = Redis.from_url(redis_url)
        app.state.script = app.state.redis.register_script(TRIVIAL)
        app.state.http = httpx.AsyncClient(
            timeout=10, trust_env=False, limits=httpx.Limits(max_connections=200)
        )
        yield
        await app.state.http.aclose()
        await app.state.redis.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/tools/supplier/{path:path}")
    async def forward(path: str, request: Request) -> Response:
        await request.app.state.script(keys=["bench:{baseline}"])
        upstream = await request.app.state.http.post(
            f"{upstream_url}/{path}",
            content=await request.body(),
            headers={
                "Idempotency-Key": request.headers.get("idempotency-key", ""),
                "Content-Type": "application/json",
            },
        )
        return Response(
            upstream.content, upstream.status_code, media_type=upstream.headers.get("content-type")
        )

    return app
