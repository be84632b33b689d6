"""A supplier's order API for the demo, the tests and load runs: a real HTTP server
that counts orders by Idempotency-Key (a repeat of a key returns the first order and
creates nothing), answers lookups by key, and can be told to misbehave.

Misbehaviour is set per request by the `quantity`/`sku` of the order itself or,
for tests, by `POST /_faults` (status to answer, delay before answering, whether to
apply the order before failing): the server stays a plain, honest upstream
otherwise."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel


class Faults(BaseModel):
    status: int = 0  # answer this status instead of 201 (0: behave)
    delay_s: float = 0.0  # wait this long before answering
    apply: bool = True  # record the order even when answering with a failure
    times: int = 1_000_000  # how many orders the faults apply to


def create_supplier() -> FastAPI:
    app = FastAPI(title="demo supplier")
    orders: dict[str, dict[str, Any]] = {}
    counter = itertools.count(1)
    state: dict[str, Any] = {"faults": Faults(times=0), "requests": 0}

    @app.post("/orders")
    async def create_order(
        request: Request, idempotency_key: str | None = Header(default=None)
    ) -> JSONResponse:
        state["requests"] += 1
        body = await request.json()
        if not idempotency_key:
            return JSONResponse({"error": "Idempotency-Key required"}, 400)
        if idempotency_key in orders:
            return JSONResponse(orders[idempotency_key], 201)
        if int(body.get("quantity", 0)) <= 0:
            return JSONResponse({"error": "quantity must be positive"}, 422)
        faults: Faults = state["faults"]
        faulty = faults.times > 0
        if faulty:
            faults.times -= 1
        if not faulty or faults.apply:
            orders[idempotency_key] = {"order_id": f"o-{next(counter)}", **body}
        if faulty and faults.delay_s:
            await asyncio.sleep(faults.delay_s)
        if faulty and faults.status:
            return JSONResponse({"error": "injected"}, faults.status)
        return JSONResponse(orders[idempotency_key], 201)

    @app.get("/orders")
    async def find_order(idempotency_key: str) -> JSONResponse:
        order = orders.get(idempotency_key)
        return JSONResponse(order, 200) if order else JSONResponse({"error": "no such order"}, 404)

    @app.get("/catalog")
    async def catalog() -> dict[str, Any]:
        return {"skus": ["steel-coil", "bolts", "paint"]}

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        return {"orders": len(orders), "requests": state["requests"], "keys": sorted(orders)}

    @app.post("/_faults")
    async def set_faults(faults: Faults) -> dict[str, Any]:
        state["faults"] = faults
        return faults.model_dump()

    return app
