"""Open a Ledger on the configured Redis, or on the embedded one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .client import Ledger
from .embedded import redis_url
from .settings import LedgerSettings


@asynccontextmanager
async def open_ledger(settings: LedgerSettings | None = None) -> AsyncIterator[Ledger]:
    with redis_url(settings or LedgerSettings()) as url:
        ledger = Ledger.from_url(url)
        try:
            yield ledger
        finally:
            await ledger.aclose()
