"""A Ledger's accounts: written from policy (upsert), read (balances, policy versions),
paced (read rates) and closed when idle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import validate
from .errors import LedgerUnavailable, RedisFailure, raise_for_reply, translate_redis_errors
from .keys import TENANTS_KEY, account_fields, accounts_key, is_shard_tenant, tenant_keys
from .records import AccountSpec, Balance
from .release import COUNTED_ESCALATIONS
from .replies import balance_from, decoded

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object

# close_idle_accounts: accounts asked for per HSCAN page, and named per close.lua call.
CLOSE_SCAN = 500
CLOSE_BATCH = 500


class Accounts(LedgerCore):
    """Accounts of each tenant (a mixin of Ledger)."""

    async def upsert_account(
        self, tenant: str, spec: AccountSpec, policy_version: int | None = None
    ) -> str:
        """Create the account or change its policy; returns 'created' or 'updated', or
        'kept' if the account holds a newer `policy_version`'s limits (None: written
        whatever it holds). With replicas asked for, followed by WAIT: a lowered
        limit lost in a failover would admit up to the old one; LedgerUnavailable
        (not_replicated) if fewer acknowledged, for the caller to write it again."""
        keys = tenant_keys(validate.tenant_id(tenant))[:2]
        args = validate.upsert_args(spec)
        if policy_version is not None:
            args.append(str(validate.amount("policy_version", policy_version)))
        reply, acked = await self._run_replicated("account", keys, args)
        raise_for_reply(tenant, "", "upsert", reply)
        if acked.fsynced == 0:
            raise LedgerUnavailable(
                "upsert",
                RedisFailure.NOT_FSYNCED,
                f"the primary had not fsynced the account change to its AOF in "
                f"{self.replica_timeout_ms} ms; write it again",
            )
        if acked.replicas is not None and acked.replicas < self.replicas:
            counted = "fsynced" if self.wait_aof == "all" else "acknowledged"
            raise LedgerUnavailable(
                "upsert",
                RedisFailure.NOT_REPLICATED,
                f"{acked.replicas} of {self.replicas} replicas {counted} the account change "
                f"in {self.replica_timeout_ms} ms; write it again once they are back",
            )
        # The list of tenants is a key of its own slot, kept for operators (audit);
        # nothing on the admission path reads it.
        await self.release.register(tenant)
        return str(reply[1])

    async def balance(self, tenant: str, account: str) -> Balance | None:
        key = accounts_key(validate.tenant_id(tenant))
        fields = account_fields(validate.account_id(account))
        with translate_redis_errors("balance"):
            values = await decoded(self.redis.hmget(key, fields))
        return None if values[0] is None else balance_from(account, values)

    async def balances(self, tenant: str) -> list[Balance]:
        """Every account of the tenant, sorted by id."""
        with translate_redis_errors("balances"):
            stored = await decoded(self.redis.hgetall(accounts_key(validate.tenant_id(tenant))))
        # '~' fields are calibrating routes' open sets (lua/_lib.lua), not accounts.
        accounts = {field.rpartition("|")[0] for field in stored if not field.startswith("~")}
        return [
            balance_from(account, [stored.get(field) for field in account_fields(account)])
            for account in sorted(accounts)
        ]

    async def tenants(self) -> list[str]:
        with translate_redis_errors("tenants"):
            return sorted(await decoded(self.redis.smembers(TENANTS_KEY)))

    async def policy_versions(
        self, accounts: Mapping[str, Sequence[str]]
    ) -> dict[str, dict[str, int]]:
        """tenant -> account -> the policy version its limits were written from (0:
        unversioned), for the `accounts` named per tenant that exist, in one round
        trip: what a host compares with the version it serves before writing limits."""
        tenants = [validate.tenant_id(tenant) for tenant in accounts]
        with translate_redis_errors("policy_versions"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    for account in accounts[tenant]:
                        pipe.hmget(accounts_key(tenant), [f"{account}|limit", f"{account}|pv"])
                replies = iter(await pipe.execute())
        found: dict[str, dict[str, int]] = {}
        for tenant in tenants:
            mine = found.setdefault(tenant, {})
            for account in accounts[tenant]:
                limit, version = next(replies)
                if limit is not None:
                    mine[account] = int(version or 0)
        return found

    async def pace_reads(self, tenant: str, accounts: Sequence[str]) -> None:
        """One read against the read rates of `accounts` (lua/rate.lua): RateLimited
        when it is too early for one of them, else each rate moves on."""
        tenant = validate.tenant_id(tenant)
        named = [validate.account_id(account) for account in accounts]
        reply = await self._run("rate", [accounts_key(tenant)], [str(len(named)), *named])
        raise_for_reply(tenant, "", "rate", reply)

    async def close_idle_accounts(
        self, tenant: str, cursor: int = 0, count: int = CLOSE_SCAN
    ) -> tuple[int, int]:
        """One page of the tenant's risk-factor accounts (HSCAN from `cursor` over its
        accounts hash), each closed if it has held nothing since its window ended
        (lua/close.lua); returns the next cursor (0: the scan is over) and how many
        were closed. Policy accounts are never closed, and none while the fleet's
        release flag says an older release may serve (its scripts cannot settle a
        hold on a closed account): then the scan is over at once. Nor an escrow
        shard's: its account holds a slice of the tenant's limit, which closing it
        would drop outside any transfer (ledger/escrow.py)."""
        tenant = validate.tenant_id(tenant)
        if not self.release.reads(COUNTED_ESCALATIONS) or is_shard_tenant(tenant):
            return 0, 0
        with translate_redis_errors("close"):
            cursor, fields = await self.redis.hscan(
                accounts_key(tenant), cursor, match="*factor:*|ws", count=count
            )
        names = (str(name) for name in fields)
        ids = sorted(
            {
                name.rpartition("|")[0]
                for name in names
                if name.startswith(("factor:", "shadow:factor:"))
            }
        )
        closed = 0
        keys = tenant_keys(tenant)[:2]
        for start in range(0, len(ids), CLOSE_BATCH):
            chunk = ids[start : start + CLOSE_BATCH]
            reply = await self._run("close", keys, [str(len(chunk)), *chunk])
            raise_for_reply(tenant, "", "close", reply)
            closed += int(reply[1])
        return int(cursor), closed
