"""The fleet's policy store: each tenant's policy text under a version in Redis
(`irrev:{tenant}:policy`), which every gateway host serves, whatever its own files
say. A write is a compare-and-set on the version the writer read (policy_put.lua),
so a host that read an older version never overwrites a newer one; every write then
bumps one fleet-wide epoch counter and announces it (ledger/changes.py: pub/sub), so
a host reads the epoch when told, and otherwise only every so often (the epoch is a
key of its own slot, bumped after the write: a writer that dies in between, or
whose bump fails, is noticed by the fleet watcher's read of every record's version,
gateway/fleetwatch.py, which bumps the epoch for it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from . import validate
from .changes import CHANNEL, announce
from .cluster import RedisClient, wait_out_migration
from .errors import translate_redis_errors
from .keys import OUTCOMES_EPOCH_KEY, POLICY_EPOCH_KEY, policy_key

log = logging.getLogger("irrev.ledger")
# Waits before trying a failed epoch bump or announcement again (then it is logged).
TELL_RETRY_S = (0.05, 0.2)


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A tenant's policy as the store holds it: `version` counts writes (1, 2, ...),
    `digest` names the text, `stamp_ms` is when its content was written (Unix ms),
    `origin` who wrote it."""

    tenant: str
    version: int
    digest: str
    text: str
    stamp_ms: int
    origin: str


@dataclass(frozen=True, slots=True)
class PutResult:
    """`won`: the store now holds the text at `version`; else another writer's
    `version` is there, to read again before deciding anew."""

    won: bool
    version: int
    stamp_ms: int


class PolicyStore:
    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        source = files("ledger.lua").joinpath("policy_put.lua").read_text(encoding="utf-8")
        self._put = redis.register_script(source)

    async def epoch(self) -> int:
        """How many writes the store has had (fleet-wide): unchanged, nothing changed."""
        return (await self.epochs())[0]

    async def epochs(self) -> tuple[int, int]:
        """(policy writes, compensation outcomes counted) fleet-wide, in one read:
        what a gateway polls to learn whether to read policies or counts again."""
        with translate_redis_errors("reading the policy epoch"):
            policy, outcomes = await self.redis.mget([POLICY_EPOCH_KEY, OUTCOMES_EPOCH_KEY])
        return int(policy or 0), int(outcomes or 0)

    async def versions(self, tenants: Sequence[str]) -> dict[str, int]:
        """The stored version of each of `tenants` that has one, in one round trip
        (without the texts: what the fleet's watcher compares every so often)."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        if not names:
            return {}
        with translate_redis_errors("reading stored policy versions"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in names:
                    pipe.hget(policy_key(tenant), "v")
                replies = await pipe.execute()
        return {tenant: int(v) for tenant, v in zip(names, replies, strict=True) if v}

    async def bump(self) -> None:
        """Bump the policy epoch and announce it, for a write whose own bump may have
        been lost: every host then reads the records of the tenants it serves."""
        with translate_redis_errors("bumping the policy epoch"):
            await self.redis.incr(POLICY_EPOCH_KEY)
        await announce(self.redis, "policy")

    async def records(self, tenants: Sequence[str]) -> dict[str, PolicyRecord]:
        """The stored policies of `tenants` (those that have one), in one round trip."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        if not names:
            return {}
        with translate_redis_errors("reading stored policies"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in names:
                    pipe.hgetall(policy_key(tenant))
                replies = await pipe.execute()
        return {
            tenant: _record(tenant, _text(fields))
            for tenant, fields in zip(names, replies, strict=True)
            if fields
        }

    async def put(
        self,
        tenant: str,
        *,
        expected: int,
        digest: str,
        text: str,
        stamp_ms: int | None,
        origin: str,
    ) -> PutResult:
        """Write `text` over version `expected` (0: none yet); `stamp_ms` None: Redis
        time now. LedgerUnavailable only if the write itself failed: once it landed,
        a failed epoch bump or announcement is logged, not raised (`_tell`)."""
        key = policy_key(validate.tenant_id(tenant))
        args = [str(expected), digest, text, "" if stamp_ms is None else str(stamp_ms), origin]
        with translate_redis_errors("writing a policy"):
            if isinstance(self.redis, RedisCluster):
                reply = await wait_out_migration(lambda: self._put(keys=[key], args=args))
            else:
                reply = await self._put(keys=[key], args=args)
            won, version, stamp = (int(part) for part in reply)
        if won:
            await self._tell()
        return PutResult(bool(won), version, stamp)

    async def _tell(self) -> None:
        """Bump the policy epoch and announce the write, retried a little; a failure is
        logged, not raised. The stored write is the outcome: raising after it took
        effect sent the writer's retry over the version it had read, to lose the
        compare-and-set to its own write. A bump lost for good is made by the fleet's
        watcher, which reads every record's version (gateway/fleetwatch.py), or by
        each host's full re-read of the store while no watcher beats
        (gateway/tenants.py: FULL_READ_S)."""
        for what, step in (
            ("bumping the policy epoch", lambda: self.redis.incr(POLICY_EPOCH_KEY)),
            ("announcing a policy write", lambda: self.redis.publish(CHANNEL, "policy")),
        ):
            for wait_s in (*TELL_RETRY_S, None):
                try:
                    await step()
                    break
                except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
                    if wait_s is None:
                        log.warning(
                            "policy written, but not told: the fleet's watcher (or each "
                            "host's full re-read of the store) finds it instead",
                            extra={"step": what, "why": f"{type(exc).__name__}: {exc}"},
                        )
                        break
                    await asyncio.sleep(wait_s)

    async def announce(self, what: str) -> None:
        """Tell every subscribed gateway (ledger/changes.py) that `what` changed:
        'lease' when a process gave leases up, so the others ask for them now."""
        await announce(self.redis, what)

    async def bump_outcomes(self) -> None:
        """Count one more compensation outcome fleet-wide and announce it: gateways
        then re-read the counts (`epochs`)."""
        if isinstance(self.redis, RedisCluster):
            with translate_redis_errors("counting an outcome"):
                await self.redis.incr(OUTCOMES_EPOCH_KEY)
            await announce(self.redis, "outcomes")
            return
        # One round trip, as before there was an announcement.
        with translate_redis_errors("counting an outcome"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(OUTCOMES_EPOCH_KEY)
                pipe.publish(CHANNEL, "outcomes")
                await pipe.execute()


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


def _record(tenant: str, fields: dict[str, str]) -> PolicyRecord:
    return PolicyRecord(
        tenant,
        int(fields.get("v", 0)),
        fields.get("digest", ""),
        fields.get("text", ""),
        int(fields.get("stamp_ms", 0)),
        fields.get("origin", ""),
    )
