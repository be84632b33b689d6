"""A Ledger's leases of background work (ledger/lease.py), the fleet's watch and the
lease of each tenant's webhook delivery with its cursor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import validate
from .errors import BadInput, translate_redis_errors
from .keys import lease_key, tenant_keys, webhook_cursor_key, webhook_lease_key
from .lease import Lease, Watch
from .records import Status

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object


class Leasing(LedgerCore):
    """Leases and the webhook cursor (a mixin of Ledger)."""

    def lease(self, tenant: str, work: str, ttl_ms: int, *, holder: str = "") -> Lease:
        """The lease of one kind of background work (`sweep`, `events`) on `tenant`:
        one holder at a time across every process on this Redis (ledger/lease.py).
        `holder` names the taker in the lease's token (default host:pid)."""
        key = lease_key(validate.tenant_id(tenant), work)
        return Lease(self.redis, key, ttl_ms, holder=holder)

    def watch(self, ttl_ms: int, *, holder: str = "") -> Watch:
        """The fleet's watch (ledger/lease.py Watch): one holder at a time across every
        process on this Redis beats and does the fleet-wide checks."""
        return Watch(self.redis, ttl_ms, holder=holder)

    async def free_leases(self, tenants: Sequence[str]) -> set[tuple[str, str]]:
        """(tenant, 'sweep' or 'webhook') of each lease of `tenants` nobody holds now,
        in one round trip (a read of each: the fleet's watcher looks for lapsed ones,
        so that no process need keep asking for leases it does not hold)."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        keys = {(tenant, "sweep"): lease_key(tenant, "sweep") for tenant in names}
        keys |= {(tenant, "webhook"): webhook_lease_key(tenant) for tenant in names}
        if not keys:
            return set()
        leases = list(keys)
        with translate_redis_errors("reading leases"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for lease in leases:
                    pipe.exists(keys[lease])
                held = await pipe.execute()
        return {lease for lease, found in zip(leases, held, strict=True) if not found}

    async def webhook_lease(
        self, tenant: str, owner: str, action: str, arg: str = ""
    ) -> tuple[bool, str]:
        """webhook.lua: 'hold' (take or renew for `arg` ms; returns the cursor),
        'advance' (move the cursor to entry `arg`) or 'release', each only by the
        lease's holder. (False, holder) when the lease is someone else's."""
        tenant = validate.tenant_id(tenant)
        keys = [
            *tenant_keys(tenant)[:2],
            webhook_lease_key(tenant),
            webhook_cursor_key(tenant),
        ]
        args = [action, validate.identifier("owner", owner)] + ([arg] if arg else [])
        reply = await self._run("webhook", keys, args)
        if reply[0] == Status.CONFLICT:
            return False, str(reply[1])
        if reply[0] == Status.BAD_INPUT:
            raise BadInput(str(reply[1]), str(reply[2]))
        return True, str(reply[1])
