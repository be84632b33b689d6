"""The app each `irrev serve` worker serves (gateway/serve.py): app_from_env's, whose
start refusals are said in one line by the parent instead of inside uvicorn's lifespan
traceback. Only workers import it (and with it the whole app)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

from fastapi import FastAPI

from gateway.app import app_from_env
from gateway.serve import REFUSAL_FILE, REFUSED, one_line
from gateway.state.policies import PolicyLoadError
from ledger import LedgerError
from pricing import PolicyError

# The start-time errors whose messages say what was wrong and what to do (Redis
# unreachable, a server that cannot keep the durability asked for, a policy that
# cannot be used); anything else is a bug, whose traceback uvicorn prints.
REFUSALS = (LedgerError, PolicyLoadError, PolicyError)

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def worker_app() -> FastAPI:
    """app_from_env's app, whose lifespan refuses to start in one line (`_refusing`)."""
    app = app_from_env()
    app.router.lifespan_context = _refusing(app.router.lifespan_context)
    return app


def _refusing(lifespan: Lifespan) -> Lifespan:
    """`lifespan`, except that a REFUSALS error met by its startup ends the worker
    (`_refuse`). One met at shutdown, or without REFUSAL_FILE (a worker not run by
    `irrev serve`), is raised as before."""

    @asynccontextmanager
    async def refusing(app: FastAPI) -> AsyncIterator[Any]:
        started = False
        try:
            async with lifespan(app) as state:
                started = True
                yield state
        except REFUSALS as exc:
            if started or not os.environ.get(REFUSAL_FILE):
                raise
            _refuse(exc, Path(os.environ[REFUSAL_FILE]))

    return refusing


def _refuse(exc: Exception, refusal: Path) -> NoReturn:
    """Write `exc`'s message as one line where `run` reads it and exit REFUSED at once:
    raising would have uvicorn log it inside a traceback. Nothing was served yet, and
    the connections opened so far close with the process."""
    line = one_line(str(exc))
    written = refusal.with_name(f"{refusal.name}.{os.getpid()}")
    written.write_text(line, encoding="utf-8")
    written.replace(refusal)  # whole: `run` may read it as soon as it exists
    os._exit(REFUSED)
