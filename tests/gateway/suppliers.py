"""Many independent suppliers behind one loopback port: `/{name}/orders` is the order
API of supplier `name` (irrev/upstreams/supplier.py's `create_supplier()`, made on first use).

Each test's tenant points its `supplier` tool at its own name, so its effect counts
(`GET /{name}/_stats`) and injected faults (`POST /{name}/_faults`) are its own.
`GET /_seen/{name}` lists the requests supplier `name` received, as
`[method, raw path with query]`, so a test can check what was forwarded byte for byte.
A supplier whose name starts with `cookies-` sets a session cookie on every answer,
as many web APIs do; `GET /_cookies/{name}` lists the Cookie headers it was sent.
`GET /_headers/{name}` lists the headers of each request supplier `name` received
(never echoed in its answers, so an answer cannot carry a credential back), and
`POST /_require/{name}` `{"header": ..., "value": ...}` makes it answer 401 to any
request without that exact header (but its `_stats` and `_faults`), as an
authenticated API does. Every answer
carries `X-Supplier-Trace` (a header the gateway drops unless a tool allows it).
A supplier whose name starts with `readers-` executes nothing and records how several
parsers read each request (irrev/upstreams/readers.py), listed at `GET /_readings/{name}`.
Run with `uvicorn tests.gateway.suppliers:app`.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from irrev.upstreams.readers import Readers
from irrev.upstreams.supplier import create_supplier


class Suppliers:
    def __init__(self) -> None:
        self.apps: dict[str, FastAPI] = {}
        self.seen: dict[str, list[tuple[str, str]]] = {}
        self.cookies: dict[str, list[str]] = {}
        self.headers: dict[str, list[list[tuple[str, str]]]] = {}
        self.required: dict[str, tuple[str, str]] = {}
        self.readers = Readers()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        name, _, rest = scope["path"].lstrip("/").partition("/")
        if scope["type"] != "http" or not name:
            await self.reply(send, 404, None)
            return
        if name == "_readings" or name.startswith("readers-"):
            await self.readers(scope, receive, send)
            return
        if name == "_seen":
            await self.reply(send, 200, self.seen.get(rest, []))
            return
        if name == "_cookies":
            await self.reply(send, 200, self.cookies.get(rest, []))
            return
        if name == "_headers":
            await self.reply(send, 200, self.headers.get(rest, []))
            return
        if name == "_require":
            wanted = json.loads(await self.body(receive))
            self.required[rest] = (wanted["header"].lower(), wanted["value"])
            await self.reply(send, 200, None)
            return
        received = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        self.headers.setdefault(name, []).append(received)
        # The test's own endpoints (`/{name}/_stats`, `/{name}/_faults`) need no token.
        guarded = name in self.required and not rest.startswith("_")
        if guarded and self.required[name] not in received:
            await self.reply(send, 401, {"error": "unauthorized"})
            return
        send = self.tracing(send, name)
        sent = [v.decode("latin-1") for k, v in scope["headers"] if k == b"cookie"]
        self.cookies.setdefault(name, []).extend(sent)
        if name.startswith("cookies-"):
            send = self.setting_cookie(send, name)
        raw = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        seen = self.seen.setdefault(name, [])
        seen.append((scope["method"], raw + (f"?{query}" if query else "")))
        app = self.apps.setdefault(name, create_supplier())
        # Starlette routes on the path below root_path.
        await app({**scope, "root_path": scope.get("root_path", "") + f"/{name}"}, receive, send)

    @staticmethod
    def tracing(send: Send, name: str) -> Send:
        async def with_trace(message: Message) -> None:
            if message["type"] == "http.response.start":
                trace = (b"x-supplier-trace", f"{name}-trace".encode())
                message = {**message, "headers": [*message.get("headers", []), trace]}
            await send(message)

        return with_trace

    @staticmethod
    async def body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    def setting_cookie(send: Send, name: str) -> Send:
        async def with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                cookie = (b"set-cookie", f"session={name}; Path=/".encode())
                message = {**message, "headers": [*message.get("headers", []), cookie]}
            await send(message)

        return with_cookie

    @staticmethod
    async def reply(send: Send, status: int, payload: object) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


app = Suppliers()
