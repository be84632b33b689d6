"""Redis clients for the ledger, built from a URL. The one place that decides which
client a URL gets and how its connections behave: a node of a Redis Cluster gets
redis-py's cluster client (ledger/cluster.py), and everything above it (Ledger,
journal, trim, audit) stays as it is."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hiredis import pack_command as _hiredis_pack
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio import connection as redis_connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from .cluster import RedisClient, cluster_client, cluster_enabled

MAX_CONNECTIONS = 128
POOL_TIMEOUT_S = 5.0


def connect(
    url: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    pool_timeout_s: float = POOL_TIMEOUT_S,
    **options: Any,
) -> RedisClient:
    """A client of the server at `url` (redis://, rediss:// or unix://) whose
    connections are bounded: past `max_connections` a call waits up to
    `pool_timeout_s` for one to come free (redis-py's default pool refuses at once,
    which under a burst turned admissions into 503s).

    A URL of any node of a Redis Cluster (INFO cluster says so) gets redis-py's
    cluster client instead, with `max_connections` per node; it follows MOVED and
    ASK, and retries by the cluster's topology rather than per connection.

    A call that fails on a broken connection (Redis restarted under a pooled socket)
    is sent again on a new one, twice at most. That is safe because every ledger
    script is idempotent by hold id: if the first attempt did run, the second finds
    its result ('exists', or a conflict naming the state it left). `options` go to
    redis-py's connection pool (a `retry` of your own replaces that one)."""
    if cluster_enabled(url, **options):
        return cluster_client(url, max_connections=max_connections, **options)
    options.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 2))
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        **options,
    )
    redis = Redis.from_pool(pool)
    _pack_with_hiredis(redis)
    return redis


_PLAIN_CONNECTIONS = (
    redis_connection.Connection,
    redis_connection.UnixDomainSocketConnection,
    redis_connection.SSLConnection,
)
_FAST_CONNECTIONS: dict[type[Any], type[Any]] = {}


def _hiredis_pack_command(self: Any, *args: Any) -> list[bytes]:
    """redis-py's asyncio connection packs commands in pure Python (~20 us for an
    EVALSHA of a reserve); hiredis packs the same bytes in C, as redis-py's sync
    connection already does when hiredis is installed."""
    first = args[0]
    if isinstance(first, str):
        args = (*first.encode().split(), *args[1:])
    elif b" " in first:
        args = (*first.split(), *args[1:])
    if any(isinstance(arg, (bytearray, memoryview)) for arg in args):
        args = tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args)
    try:
        return [_hiredis_pack(args)]
    except TypeError as exc:
        raise redis_errors.DataError(str(exc)) from exc


async def _call_packed(self: Any, packed: bytes) -> Any:
    """Send one packed command and read its reply.

    What redis-py's send_packed_command + read_response do, less the task each send
    makes when a socket timeout is set (asyncio.wait_for around the write: ~30 us of
    a ~60 us round trip on loopback, measured) and the timer each read arms: the
    socket timeout is DirectCalls' watch, which aborts the connection (`_timed_out`).
    Failures end the same way: the connection is dropped (no half-read reply is left
    on it) and the error is redis-py's TimeoutError or ConnectionError, which its
    Retry sends again."""
    try:
        self._writer.write(packed)
        await self._writer.drain()
        reply = await self._parser.read_response()
    except BaseException as exc:
        await self.disconnect(nowait=True)
        if self.irrev_timed_out:
            raise redis_errors.TimeoutError(f"Timeout reading from {self._host_error()}") from None
        if isinstance(exc, OSError):
            raise redis_errors.ConnectionError(
                f"Error while talking to {self._host_error()}: {exc}"
            ) from exc
        raise
    if self.irrev_timed_out:  # answered as its time ran out: not to be used again
        await self.disconnect(nowait=True)
    if isinstance(reply, redis_errors.ResponseError):
        raise reply
    return reply


def _timed_out(self: Any) -> None:
    """The reply did not come within the socket timeout: abort the connection, which
    ends the read waiting on it (as redis-py drops a connection that timed out)."""
    self.irrev_timed_out = True
    if self._writer is not None:
        self._writer.transport.abort()


class DirectCalls:
    """Commands sent on the client's connections without redis-py's per-call layers
    (pool checkout, retry and observability wrappers, the send task): the ledger's
    scripts, whose replies need no response callback. At 1 client on loopback those
    layers cost ~85 us per call (execute_command ~110 us against ~25 us for the
    round trip itself), more than a reserve's own ~50-70 us in Redis (measured).

    A connection is taken from the client's pool and kept for the next call, at most
    a quarter of the pool's bound kept so (a pool of under 4 keeps none); the bound
    grows by as many, so that every other command (reads, pipelines, the change
    feed) still has the whole configured number, kept connections idle or not. Once
    `release` has run (the ledger closing), none is kept. A broken connection goes back to
    the pool, which connects it again. Errors are redis-py's own: a ResponseError of
    its type (NoScriptError, MovedError...), and a ConnectionError or TimeoutError
    after the client's Retry has sent the command again, as execute_command would."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.pool = redis.connection_pool
        self.keep = self.pool.max_connections // 4
        self.pool.max_connections += self.keep
        self.idle: list[Any] = []
        self.closed = False
        # Connections waiting for a reply -> when their socket timeout runs out (loop
        # time), and the one timer that watches them all: a timer per call (asyncio's
        # timeout) cost 9-17 us of a 30-85 us call (measured).
        self.waiting: dict[Any, float] = {}
        self.watch: asyncio.TimerHandle | None = None
        self.watched: asyncio.AbstractEventLoop | None = None

    async def call(self, command: tuple[Any, ...]) -> Any:
        try:
            packed = _hiredis_pack(command)
        except TypeError as exc:
            raise redis_errors.DataError(str(exc)) from exc
        conn = self.idle.pop() if self.idle else await self.pool.get_connection()
        try:
            return await conn.retry.call_with_retry(
                lambda: self._exchange(conn, packed), lambda error: conn.disconnect(error=error)
            )
        finally:
            # A connection dropped on the way (an error, a cancelled call) goes back.
            if conn.is_connected and not self.closed and len(self.idle) < self.keep:
                self.idle.append(conn)
            else:
                await self.pool.release(conn)

    async def _exchange(self, conn: Any, packed: bytes) -> Any:
        # Connect before the watch starts (connect has its own timeouts and Retry): a
        # watch firing into connect() found no reply to abort and was forgotten, so
        # the call that followed had no socket timeout at all.
        if not conn.is_connected:
            await conn.connect()
        conn.irrev_timed_out = False
        timeout = conn.socket_timeout
        if not timeout:
            return await conn.call_packed(packed)
        loop = asyncio.get_running_loop()
        self.waiting[conn] = deadline = loop.time() + timeout
        if self.watch is None or self.watched is not loop:  # (a client used on a new loop)
            self.watched = loop
            self.watch = loop.call_at(deadline, self._check)
        try:
            return await conn.call_packed(packed)
        finally:
            self.waiting.pop(conn, None)

    def _check(self) -> None:
        """Time out the connections past their deadline; watch again until the next
        deadline while any call waits (one timer per socket timeout under load)."""
        self.watch = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn, deadline in list(self.waiting.items()):
            if deadline <= now:
                del self.waiting[conn]
                # A call abandoned on a closed loop has nothing left to abort; the
                # others past their deadline must still be timed out.
                with contextlib.suppress(RuntimeError):
                    conn.timed_out()
        if self.waiting:
            self.watch = loop.call_at(min(self.waiting.values()), self._check)

    async def release(self) -> None:
        """Give the kept connections back to the pool (before it is closed), and keep
        none from now on: a call still in flight gives its connection back too, so
        the pool's close reaches every one."""
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            await self.pool.release(conn)


def direct_calls(redis: Any) -> DirectCalls | None:
    """DirectCalls on `redis` when its connections can make them: a standalone client
    of `connect` whose connections are plain (hiredis packing: see below)."""
    if not isinstance(redis, Redis) or redis.connection is not None:
        return None
    if redis.connection_pool.connection_class not in _FAST_CONNECTIONS.values():
        return None
    return DirectCalls(redis)


def _pack_with_hiredis(redis: Redis) -> None:
    """Give the client's new connections hiredis packing, when that packs exactly what
    redis-py would: a plain connection class and UTF-8 strings."""
    pool = redis.connection_pool
    base = pool.connection_class
    encoder = redis.get_encoder()
    if base not in _PLAIN_CONNECTIONS:
        return
    if encoder.encoding.lower().replace("-", "") != "utf8" or encoder.encoding_errors != "strict":
        return
    fast = _FAST_CONNECTIONS.get(base)
    if fast is None:
        fast = type(
            f"Hiredis{base.__name__}",
            (base,),
            {
                "pack_command": _hiredis_pack_command,
                "call_packed": _call_packed,
                "timed_out": _timed_out,
            },
        )
        _FAST_CONNECTIONS[base] = fast
    pool.connection_class = fast
