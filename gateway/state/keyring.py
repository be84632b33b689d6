"""The managed keys a worker serves (ledger/keystore.py), held in memory and looked up
by token hash like the policy's own tokens, so authenticating with one costs no Redis
round trip.

Reloaded whole when the change feed heard 'keys' (or resubscribed), when the keys
epoch moved (read while the feed is down, and every `poll_s` whatever it heard), when
the tenants served change, and every `full_read_s` whatever the epoch says (a write
whose bump or announcement was lost). A revoked key is gone from memory at the next
refresh after its announcement.

Expiry is checked at each use against Redis's clock, never this host's: at each
reload the offset between Redis TIME and this process's monotonic clock is measured,
and a key's `expires_ms` is compared with the monotonic clock plus that offset. When
each key was last used is kept in memory and written in one batch per flush
(`flush`), never per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ledger import ChangeFeed, KeyKind, KeyRecord, KeyState, Ledger
from pricing import AdminRole

log = logging.getLogger("irrev.gateway")


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveKey:
    """A key that was live at the last reload: whose it is, and until when (Redis ms)."""

    key_id: str
    tenant: str
    kind: KeyKind
    member: str  # the agent's id, or the admin's
    role: AdminRole | None
    expires_ms: int | None


class Keyring:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_hash: dict[str, LiveKey] = {}
        # Redis ms minus this process's monotonic ms, measured at the last reload.
        self._offset_ms = 0.0
        self._tenants: frozenset[str] = frozenset()
        self._epoch = -1
        self._heard = -1
        self._poll_due = 0.0
        self._full_read_due = 0.0
        # tenant -> key id -> when it was last used (Redis ms), since the last flush.
        self._used: dict[str, dict[str, int]] = {}

    def now_ms(self) -> int:
        """Redis's clock as this process reckons it (monotonic + the measured offset)."""
        return int(self.clock() * 1000 + self._offset_ms)

    def find(self, token_hash: str) -> LiveKey | None:
        """The live key whose token hashes to `token_hash`; None if none, or if it has
        expired by Redis's clock."""
        key = self._by_hash.get(token_hash)
        if key is None or (key.expires_ms is not None and self.now_ms() >= key.expires_ms):
            return None
        return key

    def used(self, key: LiveKey) -> None:
        """Note that `key` was accepted now; written at the next flush."""
        self._used.setdefault(key.tenant, {})[key.key_id] = self.now_ms()

    async def refresh(
        self,
        ledger: Ledger,
        tenants: Collection[str],
        feed: ChangeFeed | None,
        poll_s: float,
        full_read_s: float,
    ) -> bool:
        """Reload if anything says the keys may have changed (module docstring);
        whether it did. While the fleet's watcher beats (`feed.watched`), it polls the
        keys epoch and compares every tenant's keys version for every process
        (gateway/state/fleetwatch.py), and this one reloads only when told."""
        now = self.clock()
        served = frozenset(tenants)
        heard = feed.heard("keys") if feed is not None else 0
        watched = feed is not None and feed.watched
        moved = served != self._tenants or (now >= self._full_read_due and not watched)
        if not moved and (
            feed is None
            or not feed.live
            or heard != self._heard
            or (now >= self._poll_due and not watched)
        ):
            moved = await ledger.keys.epoch() != self._epoch
            self._poll_due = now + poll_s
        if moved:
            await self.reload(ledger, served)
            self._full_read_due = now + full_read_s
        # Only now: a look that failed (Redis down) leaves what was heard to the next.
        self._heard = heard
        return moved

    async def reload(self, ledger: Ledger, tenants: frozenset[str]) -> None:
        """Read every key of `tenants` and Redis's clock; replace what is held."""
        epoch = await ledger.keys.epoch()
        records = await ledger.keys.records(sorted(tenants), last_used=False)
        before = self.clock()
        redis_ms = await ledger.keys.now_ms()
        after = self.clock()
        self._offset_ms = redis_ms - (before + after) / 2 * 1000
        self._by_hash = _live(records.values(), redis_ms)
        self._tenants = tenants
        self._epoch = epoch

    async def flush(self, ledger: Ledger) -> None:
        """Write when keys were last used, one batch; kept for the next flush if Redis
        refuses it."""
        used, self._used = self._used, {}
        try:
            await ledger.keys.touch(used)
        except Exception:
            for tenant, stamps in used.items():
                mine = self._used.setdefault(tenant, {})
                for key_id, ms in stamps.items():
                    mine[key_id] = max(ms, mine.get(key_id, 0))
            raise


def _live(tenants: Collection[list[KeyRecord]], now_ms: int) -> dict[str, LiveKey]:
    """The keys not revoked nor expired, by token hash. A hash held by two keys (which
    lua/keys.lua never writes within a tenant, and 256-bit tokens never make across
    tenants) opens neither: no guess at which one the caller is."""
    found: dict[str, LiveKey] = {}
    doubled: set[str] = set()
    for records in tenants:
        for record in records:
            if record.state(now_ms) is not KeyState.LIVE:
                continue
            spec = record.spec
            admin = spec.kind is KeyKind.ADMIN
            if admin and spec.role not in set(AdminRole):
                continue  # a role this version does not know grants nothing
            if record.token_sha256 in found:
                doubled.add(record.token_sha256)
            found[record.token_sha256] = LiveKey(
                key_id=record.key_id,
                tenant=record.tenant,
                kind=spec.kind,
                member=spec.admin if admin else spec.agent,
                role=AdminRole(spec.role) if admin else None,
                expires_ms=record.expires_ms,
            )
    for token_hash in doubled:
        log.error("a token hash is held by two managed keys; neither is accepted")
        found.pop(token_hash)
    return found
