"""The peer `irrev bench gateway` compares against: a FastAPI proxy that checks a
budget the way LiteLLM's proxy does (the caller's spend read from Redis with a GET,
compared with its budget, the call's cost added with INCRBYFLOAT), then forwards the
request with a pooled httpx client: httpx's own transport, or with
IRREV_BENCH_PEER_CLIENT=aiohttp the gateway's (httpx over aiohttp, as LiteLLM's own
HTTP handler sends), so that the comparison can leave the HTTP client out. Run by
uvicorn with the same settings as the gateway. The check is not atomic (two calls may both pass on
the last of a budget): that is the design irrev's atomic reserve is measured against."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis

from gateway.state.http_upstream import make_client

# Far above what a bench run spends: the peer, like irrev in the bench, admits every call.
BUDGET = 1e12


def create_baseline() -> FastAPI:
    redis_url, upstream_url = os.environ["IRREV_REDIS_URL"], os.environ["IRREV_BENCH_UPSTREAM"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = Redis.from_url(redis_url)
        if os.environ.get("IRREV_BENCH_PEER_CLIENT") == "aiohttp":
            app.state.http = make_client(10.0, 10.0, 200)
        else:
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
        redis: Redis = request.app.state.redis
        body = await request.body()
        order = json.loads(body)
        cost = float(order["quantity"]) * float(order["unit_price"])
        # LiteLLM keys spend by the hash of the caller's API key.
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        key = "spend:" + hashlib.sha256(token.encode()).hexdigest()
        spent = float(await redis.get(key) or 0)
        if spent + cost > BUDGET:
            return JSONResponse({"error": "budget_exceeded"}, 429)
        await redis.incrbyfloat(key, cost)
        upstream = await request.app.state.http.post(
            f"{upstream_url}/{path}",
            content=body,
            headers={
                "Idempotency-Key": request.headers.get("idempotency-key", ""),
                "Content-Type": "application/json",
            },
        )
        return Response(
            upstream.content, upstream.status_code, media_type=upstream.headers.get("content-type")
        )

    return app
