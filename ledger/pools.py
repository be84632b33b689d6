"""A Ledger's pools: the open holds of each calibrating route, read and repaired."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import validate
from .errors import LedgerError, raise_for_reply, translate_redis_errors
from .keys import accounts_key, ambiguous_key, deadlines_key, hold_keys, tenant_keys
from .records import OpenPool
from .replies import decoded

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object

# Reads of the open holds `repair_pools` makes before it gives up on a busy tenant.
REPAIR_TRIES = 5


class Pools(LedgerCore):
    """The open sets of calibrating routes (a mixin of Ledger)."""

    async def open_pools(self, tenant: str) -> dict[str, OpenPool]:
        """The open holds of each calibrating route of the tenant, by route tag
        (`pool_tag`); a route with none open has no entry."""
        with translate_redis_errors("open pools"):
            stored = await decoded(self.redis.hgetall(accounts_key(validate.tenant_id(tenant))))
        tags = {f[1:].rpartition("|")[0] for f in stored if f.startswith("~")}
        return {
            tag: OpenPool(
                int(stored.get(f"~{tag}|n", 0)),
                int(stored.get(f"~{tag}|s", 0)),
                float(stored.get(f"~{tag}|q", 0.0)),
            )
            for tag in tags
        }

    async def repair_pools(self, tenant: str) -> dict[str, OpenPool]:
        """Rewrite the open sets of the tenant's pooling routes from its open holds
        (lua/pools.lua), for a set out of step with them (`irrev ledger audit` says
        which): the sets after. The open holds are read first and declared; one opened
        or closed meanwhile makes the script write nothing, and it is read again."""
        tenant = validate.tenant_id(tenant)
        for _ in range(REPAIR_TRIES):
            with translate_redis_errors("repair pools"):
                due = await self.redis.zrange(deadlines_key(tenant), 0, -1)
                ambiguous = await self.redis.smembers(ambiguous_key(tenant))
            ids = sorted({str(h) for h in (*due, *ambiguous)})
            states = [await self._state(tenant, hold_id) for hold_id in ids]
            held = [h for h, st in zip(ids, states, strict=True) if st in ("pending", "ambiguous")]
            keys = [*tenant_keys(tenant), *(hold_keys(tenant, h)[0] for h in held)]
            reply = await self._run("pools", keys, [str(len(held)), *held])
            if str(reply[0]) != "retry":
                raise_for_reply(tenant, "", "repair pools", reply)
                return await self.open_pools(tenant)
        raise LedgerError(
            f"repair pools: the open holds of {tenant} changed during each of "
            f"{REPAIR_TRIES} reads; run it again when the tenant is quieter"
        )

    async def _state(self, tenant: str, hold_id: str) -> str:
        with translate_redis_errors("repair pools"):
            return str(await self.redis.hget(hold_keys(tenant, hold_id)[0], "st") or "")
