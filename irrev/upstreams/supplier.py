"""A supplier's order API for the demo, the tests and load runs: a real HTTP server
that counts orders by Idempotency-Key (a repeat of a key returns the first order and
creates nothing), answers lookups by key, and can be told to misbehave.

Misbehaviour is set per request by the `quantity`/`sku` of the order itself or,
for tests, by `POST /_faults` (status to answer, delay before answering, whether to
apply the order before failing, a body trickled out slowly, repeats held until
`POST /_release`): the server stays a plain, honest upstream otherwise.

Under `/secure/...` (`serve()` only) the same API requires `Authorization: Bearer
<token>`, the token set by `POST /_secure {"token": ...}`: 401 without it, as an
authenticated API does (for a gateway that injects the tool's credentials).

A connection reset cannot be made from inside an ASGI app, so `serve()` can also
listen on a second, raw-socket port (`--reset-port`) that shares the orders: there
`POST /orders` is read whole, handled like on the main port (recorded, faults
consumed) and answered with a TCP RST instead of a response, i.e. the connection is
reset after the request was sent; `GET /orders?idempotency_key=` is answered
normally, so a reconciler can still look the order up.

`serve()` also answers below `/_readers/{book}/` with irrev/upstreams/readers.py's parser readings
(effects recorded, nothing executed), listed at `GET /_readers/_readings/{book}`.

Run: `python -m irrev.upstreams.supplier --port 8900 [--reset-port 8901]`, or
`uvicorn irrev.upstreams.supplier:create_supplier --factory` for the main port only.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from irrev.upstreams.readers import Readers

SLOW_BODY_CHUNKS = 4
MAX_RAW_REQUEST_BYTES = 1 << 20


class Faults(BaseModel):
    status: int = 0  # answer this status instead of 201 (0: behave)
    delay_s: float = 0.0  # wait this long before answering
    apply: bool = True  # record the order even when answering with a failure
    times: int = 1_000_000  # how many orders the faults apply to
    slow_body_s: float = 0.0  # send the headers at once, then the body over this long
    # Commit the order only once the (delayed) answer is sent, and answer a repeat of
    # the key meanwhile 409 "request in progress" (the IETF Idempotency-Key draft, Stripe).
    in_progress: bool = False
    # Wait this long before answering a repeat of a key already ordered (whatever
    # `times` says): a retry that stays in flight while more repeats arrive.
    repeat_delay_s: float = 0.0
    # Hold the answer to a repeat of a key already ordered until `POST /_release`: a
    # retry that stays in flight until a test has seen what it waits for (a delay
    # stands in for that only while the machine keeps up).
    hold_repeats: bool = False
    # Hold the answer to an order the faults apply to until `POST /_release`: a call
    # that stays in flight until a test has done what it must do meanwhile.
    hold: bool = False


@dataclass(kw_only=True)
class Answer:
    status: int
    payload: dict[str, Any]
    delay_s: float = 0.0
    slow_body_s: float = 0.0
    commit_key: str = ""  # the order is recorded under this key when the answer is sent
    held: bool = False  # sent only once `Supplier.release` is set (Faults.hold_repeats)


@dataclass
class Supplier:
    """The orders and the fault state, shared by the HTTP app and the reset port."""

    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: Faults = field(default_factory=lambda: Faults(times=0))
    requests: int = 0
    requests_by_key: Counter[str] = field(default_factory=Counter)
    in_flight: set[str] = field(default_factory=set)
    secure_token: str = ""
    # Opens the answers Faults.hold and hold_repeats hold; closed again by every new
    # Faults.
    release: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def order(self, idempotency_key: str | None, body: Any) -> Answer:
        self.requests += 1
        if not idempotency_key:
            return Answer(status=400, payload={"error": "Idempotency-Key required"})
        self.requests_by_key[idempotency_key] += 1
        if idempotency_key in self.in_flight:
            return Answer(status=409, payload={"error": "request in progress"})
        if idempotency_key in self.orders:
            faults = self.faults
            return Answer(
                status=201,
                payload=self.orders[idempotency_key],
                delay_s=faults.repeat_delay_s,
                held=faults.hold_repeats,
            )
        if not isinstance(body, dict) or int(body.get("quantity", 0)) <= 0:
            return Answer(status=422, payload={"error": "quantity must be positive"})
        faults = self.faults
        faulty = faults.times > 0
        if faulty:
            faults.times -= 1
        if faulty and faults.in_progress:
            self.in_flight.add(idempotency_key)
            order = {"order_id": f"o-{next(self._ids)}", **body}
            return Answer(
                status=201,
                payload=order,
                delay_s=faults.delay_s,
                slow_body_s=faults.slow_body_s,
                commit_key=idempotency_key,
                held=faults.hold,
            )
        if not faulty or faults.apply:
            self.orders[idempotency_key] = {"order_id": f"o-{next(self._ids)}", **body}
        delay = faults.delay_s if faulty else 0.0
        slow = faults.slow_body_s if faulty else 0.0
        held = faulty and faults.hold
        if faulty and (faults.status or idempotency_key not in self.orders):
            return Answer(
                status=faults.status or 503,
                payload={"error": "injected"},
                delay_s=delay,
                slow_body_s=slow,
                held=held,
            )
        return Answer(
            status=201,
            payload=self.orders[idempotency_key],
            delay_s=delay,
            slow_body_s=slow,
            held=held,
        )

    def answered(self, answer: Answer) -> None:
        """The answer is being sent: an in-progress order is made now."""
        if answer.commit_key:
            self.orders[answer.commit_key] = answer.payload
            self.in_flight.discard(answer.commit_key)

    def stats(self) -> dict[str, Any]:
        return {
            "orders": len(self.orders),
            "requests": self.requests,
            "keys": sorted(self.orders),
            "requests_by_key": dict(self.requests_by_key),
        }


async def _trickle(body: bytes, over_s: float) -> AsyncIterator[bytes]:
    size = -(-len(body) // SLOW_BODY_CHUNKS)
    for start in range(0, len(body), size):
        await asyncio.sleep(over_s / SLOW_BODY_CHUNKS)
        yield body[start : start + size]


def create_supplier(supplier: Supplier | None = None) -> FastAPI:
    app = FastAPI(title="demo supplier")
    state = supplier or Supplier()

    @app.post("/orders")
    async def create_order(
        request: Request, idempotency_key: str | None = Header(default=None)
    ) -> Response:
        answer = state.order(idempotency_key, await request.json())
        if answer.held:
            await state.release.wait()
        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        state.answered(answer)
        if answer.slow_body_s:
            body = json.dumps(answer.payload).encode()
            return StreamingResponse(
                _trickle(body, answer.slow_body_s),
                answer.status,
                media_type="application/json",
            )
        return JSONResponse(answer.payload, answer.status)

    @app.get("/orders")
    async def find_order(idempotency_key: str) -> JSONResponse:
        order = state.orders.get(idempotency_key)
        return JSONResponse(order, 200) if order else JSONResponse({"error": "no such order"}, 404)

    @app.get("/catalog")
    async def catalog() -> dict[str, Any]:
        return {"skus": ["steel-coil", "bolts", "paint"]}

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        return state.stats()

    @app.post("/_secure")
    async def set_secure_token(request: Request) -> dict[str, Any]:
        state.secure_token = str((await request.json())["token"])
        return {"secure": True}

    @app.post("/_faults")
    async def set_faults(faults: Faults) -> dict[str, Any]:
        state.faults = faults
        state.release.clear()
        return faults.model_dump()

    @app.post("/_release")
    async def release() -> dict[str, Any]:
        """Send the answers Faults.hold and hold_repeats hold, and any later ones at
        once."""
        state.release.set()
        return {"released": True}

    return app


class Secured:
    """`/secure/<path>` is `<path>` behind the bearer token `state.secure_token`."""

    PREFIX = "/secure"

    def __init__(self, app: FastAPI, state: Supplier) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith(self.PREFIX + "/"):
            wanted = f"Bearer {self.state.secure_token}".encode()
            given = [v for k, v in scope["headers"] if k == b"authorization"]
            if not self.state.secure_token or given != [wanted]:
                await JSONResponse({"error": "unauthorized"}, 401)(scope, receive, send)
                return
            inner = path[len(self.PREFIX) :]
            scope = {**scope, "path": inner, "raw_path": inner.encode()}
        await self.app(scope, receive, send)


# -- the reset port ------------------------------------------------------------------


async def _read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_RAW_REQUEST_BYTES:
        return None
    body = await reader.readexactly(int(length)) if int(length) else b""
    return parts[0], parts[1], headers, body


def _reply(status: int, payload: Any) -> bytes:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: SO_LINGER on with a zero timeout."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _handle_reset_port(
    state: Supplier, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    request = await _read_request(reader)
    if request is None:
        _reset(writer)
        return
    method, target, headers, body = request
    url = urlsplit(target)
    if method == "POST" and url.path == "/orders":
        try:
            payload = json.loads(body or b"null")
        except ValueError:
            payload = None
        state.answered(state.order(headers.get("idempotency-key"), payload))
        _reset(writer)
        return
    if method == "GET" and url.path == "/orders":
        key = parse_qs(url.query).get("idempotency_key", [""])[0]
        order = state.orders.get(key)
        writer.write(_reply(200, order) if order else _reply(404, {"error": "no such order"}))
    else:
        writer.write(_reply(404, {"error": "not found"}))
    await writer.drain()
    writer.close()


def with_readers(app: ASGIApp, prefix: str = "/_readers") -> ASGIApp:
    """`app`, with the parser readings (irrev/upstreams/readers.py) below `prefix`."""
    readers = Readers(prefix)

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix + "/"):
            await readers(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route


async def serve(host: str, port: int, reset_port: int | None = None) -> None:
    """The app on `port` and, if given, the reset port, sharing one Supplier."""
    state = Supplier()
    config = uvicorn.Config(
        with_readers(Secured(create_supplier(state), state)),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    if reset_port is None:
        await server.serve()
        return
    raw = await asyncio.start_server(lambda r, w: _handle_reset_port(state, r, w), host, reset_port)
    async with raw:
        await server.serve()


def main() -> None:
    parser = argparse.ArgumentParser(description="the demo supplier's order API")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--reset-port", type=int, help="also listen here, resetting orders")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.reset_port))


if __name__ == "__main__":
    main()
