"""Review of DirectCalls (ledger/connect.py): a call retried after a socket timeout
must keep its socket timeout (the watch must not fire into the reconnect and be
forgotten)."""

from __future__ import annotations

import time

import pytest
import redis as sync_redis
from redis import exceptions as redis_errors

from ledger import EmbeddedRedis, connect
from ledger.connect import direct_calls

BUSY = """
local t0 = redis.call('TIME'); local start = t0[1]*1000000 + t0[2]
while true do
  local t = redis.call('TIME')
  if t[1]*1000000 + t[2] - start >= tonumber(ARGV[2]) then break end
end
return ARGV[1]
"""


def _quiet(url: str) -> None:
    """Wait out the scripts that a test's retries left running."""
    for _ in range(200):
        try:
            sync_redis.Redis.from_url(url, socket_timeout=0.2).ping()
            return
        except sync_redis.exceptions.RedisError:
            time.sleep(0.1)


async def test_a_script_retried_after_a_timeout_still_times_out(
    redis_session_server: EmbeddedRedis,
) -> None:
    """The first attempt times out; the retry's reconnect waits for the busy Redis and
    the watch fires during it. The resent script must still be read with the socket
    timeout (redis-py's execute_command raises TimeoutError here)."""
    url = redis_session_server.url
    redis = connect(url, max_connections=8, socket_timeout=0.3)
    calls = direct_calls(redis)
    assert calls is not None
    try:
        sha = await redis.script_load(BUSY)
        with pytest.raises(redis_errors.TimeoutError):
            await calls.call(("EVALSHA", sha, 0, "mine", 2_000_000))
    finally:
        _quiet(url)
        await calls.release()
        await redis.aclose()
