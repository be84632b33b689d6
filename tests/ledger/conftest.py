"""Ledger fixtures: a Ledger on each real server, and a standard set of accounts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ledger.client import Ledger
from ledger.records import AccountSpec


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


async def open_accounts(ledger: Ledger, tenant: str, **limits: int) -> None:
    """Create accounts named like `tenant_acme=1000` -> `tenant:acme` with no soft band."""
    for name, limit in limits.items():
        kind, _, rest = name.partition("_")
        await ledger.upsert_account(
            tenant, AccountSpec(account=f"{kind}:{rest}", limit=limit, soft_limit=limit)
        )
