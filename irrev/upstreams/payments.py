"""A Stripe-like payments API for the payments example (examples/payments-api.yaml),
its test and the README walk-through: a real HTTP server that behaves like the API
the example fronts, and records what it received.

- Every request needs `Authorization: Bearer <key>`, the key given to
  `create_payments()` or else in the environment variable PAYMENTS_API_KEY: 401
  otherwise (its own `/_received` included; only `GET /_health` is open).
- `POST /v1/charges|refunds|transfers` take form-encoded bodies only (415 otherwise),
  `amount` a positive whole number of cents (400 otherwise) and an `Idempotency-Key`
  (400 without); a repeat of a key returns the first object and creates nothing.
- `GET /v1/charges/{id}` reads a charge; `GET /v1/<objects>?idempotency_key=K` finds
  the object made under a key (404 if none): the gateway reconciler's lookup.
- `GET /_received` lists every other request in order: method, path, query,
  headers, body.
- Every answer carries a `Request-Id`.

Run: `PAYMENTS_API_KEY=sk_test_... uvicorn irrev.upstreams.payments:create_payments
--factory --port 8902`
"""

from __future__ import annotations

import itertools
import os
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

KEY_ENV = "PAYMENTS_API_KEY"
FORM = "application/x-www-form-urlencoded"
# The object each effect endpoint makes, its id prefix and the fields it requires.
OBJECTS = {
    "charges": ("charge", "ch", ("amount", "currency", "customer")),
    "refunds": ("refund", "re", ("amount", "charge")),
    "transfers": ("transfer", "tr", ("amount", "currency", "destination")),
}


@dataclass
class Payments:
    api_key: str
    made: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {name: {} for name in OBJECTS}
    )
    by_id: dict[str, dict[str, Any]] = field(default_factory=dict)
    received: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def create(self, objects: str, key: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        kind, prefix, required = OBJECTS[objects]
        if key in self.made[objects]:
            return 200, self.made[objects][key]
        missing = [name for name in required if name not in form]
        if missing:
            return 400, _error(f"missing required param: {missing[0]}")
        amount = form["amount"]
        if not amount.isdigit() or int(amount) == 0:
            return 400, _error("amount must be a positive whole number of cents")
        made: dict[str, Any] = {"id": f"{prefix}_{next(self._ids)}", "object": kind, **form}
        made["amount"] = int(amount)
        self.made[objects][key] = made
        self.by_id[made["id"]] = made
        return 200, made


def _error(message: str) -> dict[str, Any]:
    return {"error": {"type": "invalid_request_error", "message": message}}


def _answer(status: int, payload: object) -> JSONResponse:
    return JSONResponse(payload, status, headers={"Request-Id": f"req_{secrets.token_hex(8)}"})


def create_payments(api_key: str | None = None) -> FastAPI:
    key = api_key or os.environ.get(KEY_ENV, "")
    if not key:
        raise RuntimeError(f"set {KEY_ENV}: the API key this payments API accepts")
    app = FastAPI(title="demo payments API")
    state = Payments(key)

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        body = await request.body()
        if not request.url.path.startswith("/_"):
            state.received.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "query": request.url.query,
                    "headers": dict(request.headers),
                    "body": body.decode("latin-1"),
                }
            )
        unguarded = request.url.path == "/_health"
        if not unguarded and request.headers.getlist("authorization") != [
            f"Bearer {state.api_key}"
        ]:
            return _answer(401, _error("invalid API key"))
        response: Response = await call_next(request)
        return response

    @app.post("/v1/{objects}")
    async def create(objects: str, request: Request) -> JSONResponse:
        if objects not in OBJECTS:
            return _answer(404, _error("no such endpoint"))
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != FORM:
            return _answer(415, _error(f"send {FORM}"))
        key = request.headers.get("idempotency-key", "")
        if not key:
            return _answer(400, _error("Idempotency-Key required"))
        try:
            pairs = parse_qsl((await request.body()).decode("utf-8"), strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return _answer(400, _error("the body is not a valid form"))
        return _answer(*state.create(objects, key, dict(pairs)))

    @app.get("/v1/charges/{charge_id}")
    async def charge(charge_id: str) -> JSONResponse:
        found = state.by_id.get(charge_id)
        if found is None or found["object"] != "charge":
            return _answer(404, _error(f"no such charge: {charge_id}"))
        return _answer(200, found)

    @app.get("/v1/{objects}")
    async def lookup(objects: str, idempotency_key: str) -> JSONResponse:
        found = state.made.get(objects, {}).get(idempotency_key)
        if found is None:
            return _answer(404, _error("nothing made under this Idempotency-Key"))
        return _answer(200, found)

    @app.get("/_health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/_received")
    async def received() -> list[dict[str, Any]]:
        return state.received

    return app
