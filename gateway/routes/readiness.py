"""Whether the ledger's Redis takes writes, for /readyz. A PING and the scripts'
presence say Redis answers; a server at `maxmemory` under `noeviction`, a primary
demoted to a read-only replica or one short of its `min-replicas-to-write` answers
them all and refuses every admission. Only a write shows it: the ledger's probe write
(a key of irrev's namespace that expires, no tenant's data)."""

from __future__ import annotations

import asyncio
import time

from ledger import Ledger, WriteProbe

# How long a worker reuses its last probe write's answer. /readyz needs no token and a
# load balancer asks every few seconds from each of its nodes: however often it is
# asked, a worker writes at most once per interval, and admissions never do.
WRITE_PROBE_INTERVAL_S = 1.0


class Writes:
    """A worker's last probe write, reused for `interval_s`; one probe at a time (the
    /readyz calls that arrive while it runs wait for its answer)."""

    def __init__(self, interval_s: float = WRITE_PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = asyncio.Lock()
        self._last: tuple[float, WriteProbe] | None = None

    async def probe(self, ledger: Ledger) -> WriteProbe:
        """The answer of a probe write at most `interval_s` old; LedgerUnavailable
        (not kept) if Redis cannot be reached."""
        async with self._lock:
            if self._last is None or time.monotonic() - self._last[0] >= self.interval_s:
                self._last = (time.monotonic(), await ledger.probe_write())
            return self._last[1]
