"""`/console`: the operator's page (utilisation, the escalation queue with its filters
and bulk decisions, rules, the refusals the agents got, ambiguous holds, recent
decisions). The page is static; it calls the admin API with the token the
operator signs in with, so it needs no authority of its own.

Its script and stylesheet are files served from here, never inline and never from a
CDN, so the page works without internet under a Content-Security-Policy that allows
nothing but this origin's own script, style and API: an injected string can neither
run nor phone home."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()
_STATIC = files("gateway").joinpath("static")
# name -> media type: the only files /console serves.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on each load: a gateway upgrade changes the page and its script together.
    "Cache-Control": "no-cache",
}
_PAGE = _STATIC.joinpath("console.html").read_bytes()
_FILES = {name: _STATIC.joinpath(name).read_bytes() for name in ASSETS}


@router.get("/console", include_in_schema=False)
async def console() -> Response:
    return Response(_PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)


def _asset(name: str) -> Response:
    return Response(_FILES[name], media_type=ASSETS[name], headers=HEADERS)


@router.get("/console/console.js", include_in_schema=False)
async def script() -> Response:
    return _asset("console.js")


@router.get("/console/console.css", include_in_schema=False)
async def stylesheet() -> Response:
    return _asset("console.css")


@router.get("/console/icon.svg", include_in_schema=False)
async def icon() -> Response:
    return _asset("icon.svg")
