"""A payments API that pays every request it is sent: it keeps no Idempotency-Key,
so a request made twice is two payments (what the crash and resume tests count).

`POST /v1/charges` and `POST /v1/transfers` take a form (or JSON) body and answer
the payment with an id; `GET /_payments` lists every payment made, in order, with its
fields and the Idempotency-Key it came with; `GET /_ready` answers 200.
Run with `uvicorn tests.clients.payments:app`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
PREFIXES = {"charges": "ch", "transfers": "tr"}
payments: list[dict[str, Any]] = []


@app.get("/_ready")
async def ready() -> dict[str, str]:
    return {}


@app.get("/_payments")
async def made() -> list[dict[str, Any]]:
    return payments


@app.post("/v1/{objects}")
async def pay(objects: str, request: Request) -> JSONResponse:
    if objects not in PREFIXES:
        return JSONResponse({"error": "no such endpoint"}, 404)
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/json"):
        fields = dict(await request.json())
    else:
        fields = dict(parse_qsl(body.decode(), strict_parsing=True))
    payment = {"id": f"{PREFIXES[objects]}_{len(payments) + 1}", "object": objects, **fields}
    payments.append({**payment, "idempotency_key": request.headers.get("idempotency-key")})
    return JSONResponse(payment)
