"""Structured logs: one JSON object per line, carrying the request id (and the hold
id where there is one), so one effect can be followed across workers."""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge import metrics

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
# Any other method is one label value: a client cannot add series by inventing methods.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_STANDARD = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
            "request_id": REQUEST_ID.get() or None,
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("irrev")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


class RequestIdMiddleware:
    """Takes the caller's X-Request-Id (or makes one), logs the request and echoes it;
    counts and times it by route template (the route the router matched, so a path
    parameter adds no series; "unmatched" for none)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger("irrev.http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if 0 < len(given) <= 64 and given.isprintable() else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        started, status = time.perf_counter(), 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            method = scope["method"] if scope["method"] in _METHODS else "other"
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.child(metrics.HTTP_REQUESTS, method, route, str(status or 500)).inc()
            metrics.child(metrics.HTTP_SECONDS, method, route).observe(elapsed)
            self.log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "ms": round(elapsed * 1000, 2),
                },
            )
            REQUEST_ID.reset(token)
