"""The ledger's scripts on a standalone Redis go past redis-py's per-call layers
(ledger/connect.py's DirectCalls) on connections it keeps between calls: a kept
connection must never hand one call another's reply, must come back after the
server drops it, must not starve the pool, and a traced client keeps its spans."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from ledger import EmbeddedRedis, Ledger, connect
from ledger.connect import DirectCalls, direct_calls

from .conftest import open_accounts

HOUR_MS = 3_600_000


@pytest.fixture
async def direct(redis_session_server: EmbeddedRedis) -> AsyncIterator[DirectCalls]:
    redis = connect(redis_session_server.url, max_connections=8)
    calls = direct_calls(redis)
    assert calls is not None
    yield calls
    await calls.release()
    await redis.aclose()


async def test_a_cancelled_call_leaves_no_reply_for_the_next(direct: DirectCalls) -> None:
    """A call cancelled while Redis has yet to answer (a gateway's request cut off)
    drops its connection: the late reply must not become the next call's."""
    key = "irrev:{direct}:cancelled"
    await direct.call(("DEL", key))
    waiting = asyncio.create_task(direct.call(("BLPOP", key, 5)))
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await direct.call(("RPUSH", key, "late")) == 1
    assert await direct.call(("ECHO", "mine")) == "mine"
    assert await direct.call(("LPOP", key)) == "late"


async def test_a_connection_the_server_dropped_is_made_again(
    direct: DirectCalls, redis_session_server: EmbeddedRedis
) -> None:
    assert await direct.call(("ECHO", "kept")) == "kept"
    [kept] = direct.idle
    client_id = await direct.call(("CLIENT", "ID"))
    killer = connect(redis_session_server.url)
    try:
        assert await killer.execute_command("CLIENT", "KILL", "ID", client_id) == 1
    finally:
        await killer.aclose()
    # The kept connection is dead; the client's Retry connects it again.
    assert direct.idle == [kept]
    assert await direct.call(("ECHO", "again")) == "again"
    assert await direct.call(("CLIENT", "ID")) != client_id


async def test_a_read_past_the_socket_timeout_is_a_timeout_and_drops_the_connection(
    redis_session_server: EmbeddedRedis,
) -> None:
    redis = connect(redis_session_server.url, max_connections=8, socket_timeout=0.2)
    calls = direct_calls(redis)
    assert calls is not None
    try:
        with pytest.raises(redis_errors.TimeoutError):
            await calls.call(("BLPOP", "irrev:{direct}:never", 2))
        assert calls.idle == []
        assert await calls.call(("ECHO", "after")) == "after"
    finally:
        await calls.release()
        await redis.aclose()


async def test_errors_keep_redis_pys_types(direct: DirectCalls) -> None:
    with pytest.raises(redis_errors.NoScriptError):
        await direct.call(("EVALSHA", "0" * 40, 0))
    with pytest.raises(redis_errors.ResponseError, match="wrong number of arguments"):
        await direct.call(("GET",))
    with pytest.raises(redis_errors.DataError):
        await direct.call(("ECHO", None))
    assert await direct.call(("ECHO", "fine")) == "fine"


async def reserve_then_read(ledger: Ledger, tenant: str) -> None:
    """A script call, then a read that needs a connection of the pool's own."""
    await open_accounts(ledger, tenant, tenant_acme=100)
    await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
    balance = await ledger.balance(tenant, "tenant:acme")
    assert balance is not None and balance.pending == 1


async def test_a_small_pool_keeps_no_connection_from_other_commands(
    redis_session_server: EmbeddedRedis, tenant: str
) -> None:
    """With one connection in the pool, none is kept: a read after a reserve must get
    it (kept, it would wait out the pool's timeout: pool_exhausted)."""
    ledger = Ledger.from_url(redis_session_server.url, max_connections=1, pool_timeout_s=0.2)
    try:
        await reserve_then_read(ledger, tenant)
    finally:
        await ledger.aclose()


async def test_a_traced_client_sends_scripts_through_execute_command(
    redis_session_server: EmbeddedRedis, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenTelemetry's Redis instrumentation wraps execute_command (its spans are the
    ledger's Redis calls in a trace): a wrapped client's scripts must go through it."""
    ledger = Ledger.from_url(redis_session_server.url)
    sent: list[Any] = []
    plain = ledger.redis.execute_command

    @functools.wraps(plain)
    async def traced(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return await plain(*args, **options)

    try:
        await open_accounts(ledger, tenant, tenant_acme=100)
        await ledger.reserve(tenant, "k1", "fp", {"tenant:acme": 1}, ttl_ms=HOUR_MS)
        assert sent == []
        monkeypatch.setattr(ledger.redis, "execute_command", traced)
        await ledger.post(tenant, "k1", 1)
        assert sent[-1] in ("FCALL", "EVALSHA")
    finally:
        await ledger.aclose()


async def test_a_kept_connection_leaves_the_pool_its_whole_bound(
    redis_session_server: EmbeddedRedis, tenant: str
) -> None:
    """A pool of 4 keeps one connection for scripts; with three taken by other work
    (a pipeline, the change feed), a read after a reserve must still get one (kept
    out of the pool's bound, it waited out the pool's timeout: pool_exhausted)."""
    ledger = Ledger.from_url(redis_session_server.url, max_connections=4, pool_timeout_s=0.2)
    assert isinstance(ledger.redis, Redis)  # a standalone server
    pool = ledger.redis.connection_pool
    taken = [await pool.get_connection() for _ in range(3)]
    try:
        await reserve_then_read(ledger, tenant)
    finally:
        for conn in taken:
            await pool.release(conn)
        await ledger.aclose()


async def test_a_call_in_flight_at_close_keeps_no_connection(direct: DirectCalls) -> None:
    """The ledger closing while a call waits (a gateway shutting down): the call's
    connection goes back to the pool, which closes it, instead of being kept after
    the kept ones were given back (left open for ever)."""
    key = "irrev:{direct}:closing"
    await direct.call(("DEL", key))
    waiting = asyncio.create_task(direct.call(("BLPOP", key, 5)))
    await asyncio.sleep(0.2)
    await direct.release()
    assert await direct.call(("RPUSH", key, "x")) == 1
    assert await waiting == [key, "x"]
    assert direct.idle == []
