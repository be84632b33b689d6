"""`/console`: a small operator page for balances, the journal and the escalation
queue. The page is static; it calls the admin API with the token the operator types,
so it needs no authority of its own."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()
_PAGE = files("gateway").joinpath("static/console.html").read_text(encoding="utf-8")


@router.get("/console", include_in_schema=False)
async def console() -> HTMLResponse:
    return HTMLResponse(
        _PAGE, headers={"Content-Security-Policy": "default-src 'self' 'unsafe-inline'"}
    )
