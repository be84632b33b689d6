"""Redis clients for the ledger, built from a URL. The one place that decides which
client a URL gets and how its connections behave: a Redis Cluster client plugs in
here, and everything above it (Ledger, journal, trim, audit) stays as it is."""

from __future__ import annotations

from typing import Any

from hiredis import pack_command as _hiredis_pack
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio import connection as redis_connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

MAX_CONNECTIONS = 128
POOL_TIMEOUT_S = 5.0


def connect(
    url: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    pool_timeout_s: float = POOL_TIMEOUT_S,
    **options: Any,
) -> Redis:
    """A client of the server at `url` (redis://, rediss:// or unix://) whose
    connections are bounded: past `max_connections` a call waits up to
    `pool_timeout_s` for one to come free (redis-py's default pool refuses at once,
    which under a burst turned admissions into 503s).

    A call that fails on a broken connection (Redis restarted under a pooled socket)
    is sent again on a new one, twice at most. That is safe because every ledger
    script is idempotent by hold id: if the first attempt did run, the second finds
    its result ('exists', or a conflict naming the state it left). `options` go to
    redis-py's connection pool (a `retry` of your own replaces that one)."""
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
        fast = type(f"Hiredis{base.__name__}", (base,), {"pack_command": _hiredis_pack_command})
        _FAST_CONNECTIONS[base] = fast
    pool.connection_class = fast
