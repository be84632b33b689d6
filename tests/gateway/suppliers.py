"""Many independent suppliers behind one loopback port: `/{name}/orders` is the order
API of supplier `name` (sim/supplier.py's `create_supplier()`, made on first use).

Each test's tenant points its `supplier` tool at its own name, so its effect counts
(`GET /{name}/_stats`) and injected faults (`POST /{name}/_faults`) are its own.
`GET /_seen/{name}` lists the requests supplier `name` received, as
`[method, raw path with query]`, so a test can check what was forwarded byte for byte.
A supplier whose name starts with `cookies-` sets a session cookie on every answer,
as many web APIs do; `GET /_cookies/{name}` lists the Cookie headers it was sent.
A supplier whose name starts with `readers-` executes nothing and records how several
parsers read each request (sim/readers.py), listed at `GET /_readings/{name}`.
Run with `uvicorn tests.gateway.suppliers:app`.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from sim.readers import Readers
from sim.supplier import create_supplier


class Suppliers:
    def __init__(self) -> None:
        self.apps: dict[str, FastAPI] = {}
        self.seen: dict[str, list[tuple[str, str]]] = {}
        self.cookies: dict[str, list[str]] = {}
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
