"""One bound on every request body, before anything reads it: FastAPI reads a route's
body parameters before its authentication dependency runs, so without this an
unauthenticated client could make a worker buffer a body of any size. A declared
Content-Length over the bound is refused at once (413, nothing read); a chunked body
is cut when it passes the bound. Routes keep their own, tighter checks."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import Problem

# A tenant's policy document may be larger than any agent's request.
POLICY_UPLOAD = re.compile(r"/v1/admin/tenants/[^/]+/policy")


def too_large(limit: int) -> Problem:
    return Problem(
        413,
        "body_too_large",
        f"request bodies are limited to {limit} bytes",
        headers={"Connection": "close"},
    )


class BodyLimit:
    """ASGI middleware: at most `limit` bytes of body per request, `policy_limit` for a
    policy upload (PUT /v1/admin/tenants/{tenant}/policy)."""

    def __init__(self, app: ASGIApp, limit: int, policy_limit: int) -> None:
        self.app = app
        self.limit = limit
        self.policy_limit = policy_limit

    def limit_of(self, scope: Scope) -> int:
        if scope["method"] == "PUT" and POLICY_UPLOAD.fullmatch(scope["path"]):
            return self.policy_limit
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await too_large(limit).response()(scope, receive, send)
            return
        received, body_done, refused, started = 0, False, False, False

        async def bounded_receive() -> Message:
            nonlocal received, body_done, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if body_done or message["type"] != "http.request":
                return message
            received += len(message.get("body", b""))
            body_done = not message.get("more_body", False)
            if received <= limit:
                return message
            # The app sees the client go away; the client gets the 413.
            refused = True
            if not started:
                await too_large(limit).response()(scope, receive, send)
            return {"type": "http.disconnect"}

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 was the answer; whatever the app says now is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except Exception:
            if not refused:
                raise
