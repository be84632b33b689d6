"""What a Ledger learns from settled holds: compensation outcomes (learned prices) and
realised residual factors (self-calibrating prices), recorded once per hold and read
for every tenant in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import validate
from .errors import raise_for_reply, translate_redis_errors
from .keys import factors_key, hold_script_keys, observed_key
from .records import RouteFactors, RouteOutcomes, Status

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object


class Learning(LedgerCore):
    """Outcomes and factors of settled holds (a mixin of Ledger)."""

    async def learn(self, tenant: str, hold_id: str, route_id: str, failed: bool) -> bool:
        """Count a posted hold's compensation outcome for its route's learned prices,
        once per hold: False if this hold's outcome was counted already."""
        outcome = "failures" if failed else "successes"
        tenant = validate.tenant_id(tenant)
        args = [validate.identifier("hold_id", hold_id), route_id, outcome]
        keys = [*hold_script_keys(tenant, hold_id), observed_key(tenant, outcome)]
        reply, _ = await self._on_hold("learn", tenant, hold_id, keys, args)
        counted = raise_for_reply(tenant, hold_id, "learn", reply) is Status.OK
        if counted:
            # Gateways re-read the counts when this moves (PolicyStore.epochs).
            await self.policies.bump_outcomes()
        return counted

    async def calibrate(
        self, tenant: str, hold_id: str, route_id: str, factor_ppm: int, keep: int
    ) -> bool:
        """Record a posted hold's realised residual factor (ppm) for its route's
        self-calibrating price, once per hold: False if it was recorded already."""
        tenant = validate.tenant_id(tenant)
        args = [validate.identifier("hold_id", hold_id), route_id, str(factor_ppm), str(keep)]
        keys = [*hold_script_keys(tenant, hold_id), factors_key(tenant)]
        reply, _ = await self._on_hold("calibrate", tenant, hold_id, keys, args)
        recorded = raise_for_reply(tenant, hold_id, "calibrate", reply) is Status.OK
        if recorded:
            # Gateways re-read settled factors with the counts when this moves: a look
            # between `learn`'s bump and this write sees the next bump.
            await self.policies.bump_outcomes()
        return recorded

    async def outcomes(self, tenants: Sequence[str]) -> dict[str, dict[str, RouteOutcomes]]:
        """The compensation outcomes counted so far (by `learn`) for each tenant, by
        route id, in one round trip."""
        tenants = [validate.tenant_id(tenant) for tenant in tenants]
        with translate_redis_errors("reading compensation outcomes"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(observed_key(tenant, "failures"))
                    pipe.hgetall(observed_key(tenant, "successes"))
                replies = await pipe.execute()
        counted = {}
        for tenant, failures, successes in zip(tenants, replies[::2], replies[1::2], strict=True):
            counted[tenant] = {
                route: RouteOutcomes(int(failures.get(route, 0)), int(successes.get(route, 0)))
                for route in failures.keys() | successes.keys()
            }
        return counted

    async def settled_factors(self, tenants: Sequence[str]) -> dict[str, dict[str, RouteFactors]]:
        """The realised residual factors recorded so far (by `calibrate`) for each
        tenant, by route id, in one round trip."""
        tenants = [validate.tenant_id(tenant) for tenant in tenants]
        with translate_redis_errors("reading settled factors"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(factors_key(tenant))
                replies = await pipe.execute()
        found: dict[str, dict[str, RouteFactors]] = {}
        for tenant, stored in zip(tenants, replies, strict=True):
            fields: dict[str, str] = stored
            routes = {key[2:] for key in fields if key.startswith("n|")}
            found[tenant] = {
                route: RouteFactors(
                    int(fields[f"n|{route}"]),
                    int(fields.get(f"s|{route}", 0)),
                    int(fields.get(f"q|{route}", 0)),
                    tuple(int(x) for x in fields.get(f"t|{route}", "").split(",") if x),
                )
                for route in routes
            }
        return found
