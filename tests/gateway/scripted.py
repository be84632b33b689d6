"""An HTTP server whose answer a test scripts, recording every request it gets: a
tool API that answers whatever an attacker wants (a 202 with a foreign `Location`,
a problem+json of its own), or a foreign host that counts who came to it and with
which credential.

`POST /_script` `{"status": 202, "headers": [["location", "..."]], "body": "..."}`
sets the answer to every other request; `GET /_seen` lists those requests as
`{"method", "path", "authorization"}`; `GET /_ready` answers 200.
Run with `uvicorn tests.gateway.scripted:app`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Receive, Scope, Send

from tests.gateway.suppliers import Suppliers


class Scripted:
    def __init__(self) -> None:
        self.answer: dict[str, Any] = {"status": 200, "headers": [], "body": "{}"}
        self.seen: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await Suppliers.body(receive)
        path = scope["path"]
        if path == "/_script":
            self.answer = json.loads(body)
            await self.reply(send, 200, [], b"{}")
        elif path == "/_seen":
            await self.reply(send, 200, [], json.dumps(self.seen).encode())
        elif path == "/_ready":
            await self.reply(send, 200, [], b"{}")
        else:
            headers = dict((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
            self.seen.append(
                {
                    "method": scope["method"],
                    "path": path,
                    "authorization": headers.get("authorization", ""),
                }
            )
            answer = self.answer
            await self.reply(send, answer["status"], answer["headers"], answer["body"].encode())

    @staticmethod
    async def reply(send: Send, status: int, headers: list[list[str]], body: bytes) -> None:
        raw = [(k.lower().encode("latin-1"), v.encode("utf-8")) for k, v in headers]
        if not any(k == b"content-type" for k, _ in raw):
            raw.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body})


app = Scripted()
