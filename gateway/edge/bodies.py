"""One bound on every request body, before anything reads it: FastAPI reads a route's
body parameters before its authentication dependency runs, so without this an
unauthenticated client could make a worker buffer a body of any size, or hold it
with a body trickled for ever. A declared Content-Length over the bound is refused
(413) without being kept; a chunked body is cut when it passes the bound; a body not
whole within the deadline is cut (408). Routes that know a tighter bound once the
caller is known (the tenant's request_limits) read through `read_body`.

A client still sending when the 413 goes out and the connection closes sees a reset,
not the answer. So the rest of a body at most DRAIN_BYTES past the bound is read and
dropped first (within the same deadline); only a larger one is cut at once.

One body is read here for its meaning too: a person's reason for a decision (approve,
reject, resolve, a rule), shown to the agent and journaled. It is bounded and has no
control characters (which would forge lines in logs, terminals and the console), nor
format characters or line and paragraph separators (Unicode Cf, Zl, Zp: bidi
overrides that reorder what a reader sees, zero-width characters that hide text,
U+2028 that breaks a line)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.edge.problems import Problem, body_timeout, schema_problem
from gateway.settings import GatewaySettings

DRAIN_BYTES = 1 << 20
Model = TypeVar("Model", bound=BaseModel)
# The middleware's refusals end the connection: what the client still sends is not read.
CLOSE = {"Connection": "close"}
# A tenant's policy document may be larger than any agent's request.
POLICY_UPLOAD = re.compile(r"/v1/admin/tenants/[^/]+/policy")
# RFC 9110's media-type (8.3.1); header values are read as Latin-1, so obs-text is
# \x80-\xff.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_MEDIA_TYPE = re.compile(
    rf"(?P<type>{_TOKEN})/(?P<subtype>{_TOKEN})"
    rf"(?:[ \t]*;[ \t]*(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*"
)


def too_large(limit: int, headers: dict[str, str] | None = None) -> Problem:
    return Problem(
        413, "body_too_large", f"request bodies are limited to {limit} bytes", headers=headers
    )


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body of a request the middleware let through, at most `limit` bytes
    (refused on its declared length unread), within `timeout_s` (problems otherwise);
    one FastAPI already read comes back as it was read."""
    declared = request.headers.get("content-length")
    if declared is not None and (
        not (declared.isascii() and declared.isdigit()) or int(declared) > limit
    ):
        raise too_large(limit)
    try:
        async with asyncio.timeout(timeout_s):
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise body_timeout(timeout_s) from None


async def read_json(request: Request, limit: int, timeout_s: float) -> bytes:
    """`read_body` of a body read as JSON: 415 for one that does not say it is, with
    one Content-Type of `application/json` or a JSON-based `application/<x>+json` (any
    well-formed parameters), as FastAPI took a body parameter; a body without one is
    refused too, as FastAPI's strict content type did. No body has no type to check.
    So nothing is parsed as JSON that its sender called a form or text, which another
    reader of the same request would read otherwise."""
    raw = await read_body(request, limit, timeout_s)
    types = request.headers.getlist("content-type")
    if raw and (len(types) != 1 or not _is_json(types[0])):
        if not types:
            said = "A body without a Content-Type"
        elif len(types) > 1:
            said = f"A body with {len(types)} Content-Type headers"
        else:
            said = f"Content-Type {types[0][:100]!r}"
        raise Problem(
            415,
            "unsupported_media_type",
            f"{said} is not accepted here: send the body as JSON, with one "
            "Content-Type: application/json",
        )
    return raw


def _is_json(content_type: str) -> bool:
    """One media type (RFC 9110's grammar, whole): a header holding a list of them
    (`application/foo, application/x+json`) is read as another type by a reader that
    splits it, and is refused."""
    media = _MEDIA_TYPE.fullmatch(content_type.strip())
    if media is None:
        return False
    kind, subtype = media["type"].lower(), media["subtype"].lower()
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_model(
    request: Request, model: type[Model], settings: GatewaySettings, empty_ok: bool = False
) -> Model:
    """An admin's body as `model` (at most IRREV_MAX_BODY_BYTES, whole within the body
    deadline), read by hand once the caller may act (`read_json`): as a body parameter
    it was parsed and validated before the route checked the caller's role, and a
    caller who may not act learnt 422 about its shape instead of 401 or 403.
    `empty_ok`: no body is the model's defaults."""
    raw = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
    try:
        return model.model_validate_json(raw if raw.strip() or not empty_ok else b"{}")
    except ValidationError as exc:
        raise schema_refusal(exc) from exc


class BodyLimit:
    """ASGI middleware: at most `limit` bytes of body per request, `policy_limit` for a
    policy upload (PUT /v1/admin/tenants/{tenant}/policy), whole within `timeout_s` of
    the request's start."""

    def __init__(self, app: ASGIApp, limit: int, policy_limit: int, timeout_s: float) -> None:
        self.app = app
        self.limit = limit
        self.policy_limit = policy_limit
        self.timeout_s = timeout_s

    def limit_of(self, scope: Scope) -> int:
        if scope["method"] == "PUT" and POLICY_UPLOAD.fullmatch(scope["path"]):
            return self.policy_limit
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope)
        deadline = time.monotonic() + self.timeout_s
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            if declared.isdigit() and int(declared) <= limit + DRAIN_BYTES:
                await drain(receive, deadline)
            await too_large(limit, CLOSE).response()(scope, receive, send)
            return
        received, body_done, refused, started = 0, False, False, False

        async def refuse(problem: Problem) -> Message:
            # The app sees the client go away; the client gets the problem.
            nonlocal refused
            refused = True
            if not started:
                await problem.response()(scope, receive, send)
            return {"type": "http.disconnect"}

        async def bounded_receive() -> Message:
            nonlocal received, body_done
            if refused:
                return {"type": "http.disconnect"}
            if body_done:
                # Past the body, receive only waits for a disconnect: no deadline.
                return await receive()
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    message = await receive()
            except TimeoutError:
                return await refuse(body_timeout(self.timeout_s))
            if message["type"] != "http.request":
                return message
            received += len(message.get("body", b""))
            body_done = not message.get("more_body", False)
            if received > limit:
                if not body_done:
                    await drain(receive, deadline, DRAIN_BYTES)
                return await refuse(too_large(limit, CLOSE))
            return message

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


async def drain(receive: Receive, deadline: float, at_most: int = DRAIN_BYTES) -> None:
    """Read and drop the rest of a refused body, up to `at_most` bytes and until the
    deadline, so that the client has finished sending when the refusal goes out."""
    dropped = 0
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
            while dropped <= at_most:
                message = await receive()
                if message["type"] != "http.request":
                    return
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


MAX_NOTE_CHARS = 500  # at most 2000 bytes of UTF-8: within the ledger's 2048
# Text a person writes for other people to read (a reason, a key's owner and purpose):
# no control, format or separator characters (the module's docstring).
SHOWN_TEXT = r"^[^\x00-\x1f\x7f-\x9f\p{Cf}\p{Zl}\p{Zp}]*$"

Note = Annotated[str, StringConstraints(max_length=MAX_NOTE_CHARS, pattern=SHOWN_TEXT)]


class Ruling(BaseModel):
    """The optional body of an approval or a rejection: a person's ruling on an
    escalation, with its reason (not the gateway's `Decision` on an effect)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Note = ""


async def ruling_of(request: Request, settings: GatewaySettings) -> Ruling:
    """The optional body of an approval or a rejection, read once the caller's role
    has been checked (`read_model`)."""
    return await read_model(request, Ruling, settings, empty_ok=True)


def body_schema(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its body by hand (after its
    caller is known, within its limits): with no body parameter, FastAPI cannot
    describe it."""
    content = {"application/json": {"schema": model.model_json_schema()}}
    return {"requestBody": {"required": required, "content": content}}


def schema_refusal(exc: ValidationError) -> Problem:
    """A body validated by hand, refused as FastAPI refuses a body parameter (422
    bad_request, its fields named from `body`)."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    return schema_problem(errors, within=("body",))
