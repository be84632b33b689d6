"""Ledger fixtures: a Ledger on each real server, a standard set of accounts, and a
count of the sends to Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator

import pytest
from redis.asyncio.connection import AbstractConnection

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


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], int]]:
    """Sends to Redis so far, counted where redis-py writes to a connection: a
    pipeline is one send, whatever it holds (Redis itself stays real)."""
    sent = 0
    send = AbstractConnection.send_packed_command

    async def counted(
        self: AbstractConnection, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        nonlocal sent
        sent += 1
        await send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    yield lambda: sent
