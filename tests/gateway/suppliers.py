"""Many independent suppliers behind one loopback port: `/{name}/orders` is the order
API of supplier `name` (sim/supplier.py's `create_supplier()`, made on first use).

Each test's tenant points its `supplier` tool at its own name, so its effect counts
(`GET /{name}/_stats`) and injected faults (`POST /{name}/_faults`) are its own.
Run with `uvicorn tests.gateway.suppliers:app`.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from sim.supplier import create_supplier


class Suppliers:
    def __init__(self) -> None:
        self.apps: dict[str, FastAPI] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        name = scope["path"].lstrip("/").partition("/")[0]
        if scope["type"] != "http" or not name:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        app = self.apps.setdefault(name, create_supplier())
        # Starlette routes on the path below root_path.
        await app({**scope, "root_path": scope.get("root_path", "") + f"/{name}"}, receive, send)


app = Suppliers()
