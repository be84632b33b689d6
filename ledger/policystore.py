"""The fleet's policy store: each tenant's policy text under a version in Redis
(`irrev:{tenant}:policy`), which every gateway host serves, whatever its own files
say. A write is a compare-and-set on the version the writer read, its number and its
digest (policy_put.lua), so a host that read an older version never overwrites a
newer one, nor one that read a version a failover lost the version written in its
place under the same number; versions are
stamped by Redis's clock, kept in a history (the last POLICY_HISTORY), and each
host's file is remembered as the host last read it (its source), the base from
which its next edit is measured (docs/design.md, "Policy changes"). Every write then
bumps one fleet-wide epoch counter and announces it (ledger/changes.py: pub/sub), so
a host reads the epoch when told, and otherwise only every so often (the epoch is a
key of its own slot, bumped after the write: a writer that dies in between, or
whose bump fails, is noticed by the fleet watcher's read of every record's version,
gateway/state/fleetwatch.py, which bumps the epoch for it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from . import validate
from .changes import announce, bump_epoch, tell
from .cluster import RedisClient
from .errors import translate_redis_errors
from .keys import (
    OUTCOMES_EPOCH_KEY,
    POLICY_EPOCH_KEY,
    accounts_key,
    policy_key,
    policy_log_key,
    policy_sources_key,
)
from .topology import topology_of

# Versions kept in each tenant's history: what `irrev policy history` shows, and how
# old a version an upload may name as its base (If-Match) and still be merged.
POLICY_HISTORY = 50


@dataclass(frozen=True, slots=True, kw_only=True)
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
    """`won`: the store now holds the text at `version` (`digest`); else another
    writer's `version` is there, to read again before deciding anew."""

    won: bool
    version: int
    stamp_ms: int
    digest: str


class PolicyStore:
    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        self.topology = topology_of(redis)
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

    async def versions(self, tenants: Sequence[str]) -> dict[str, tuple[int, str]]:
        """The stored version of each of `tenants` that has one, its number and its
        digest, in one round trip (without the texts: what the fleet's watcher
        compares every so often). The number alone would not do: after a failover
        that lost a version, the new primary's next write has its number."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        if not names:
            return {}
        with translate_redis_errors("reading stored policy versions"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in names:
                    pipe.hmget(policy_key(tenant), ["v", "digest"])
                replies = await pipe.execute()
        return {
            tenant: (int(v), digest.decode() if isinstance(digest, bytes) else str(digest))
            for tenant, (v, digest) in zip(names, replies, strict=True)
            if v
        }

    async def bump(self) -> None:
        """Bump the policy epoch and announce it, for a write whose own bump may have
        been lost: every host then reads the records of the tenants it serves."""
        with translate_redis_errors("bumping the policy epoch"):
            await bump_epoch(self.redis, POLICY_EPOCH_KEY)
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

    async def history(self, tenant: str, count: int = POLICY_HISTORY) -> list[PolicyRecord]:
        """The tenant's last `count` stored versions, newest first."""
        key = policy_log_key(validate.tenant_id(tenant))
        with translate_redis_errors("reading a policy history"):
            entries = await self.redis.lrange(key, 0, max(count, 1) - 1)
        return [_entry(tenant, raw) for raw in entries]

    async def version(self, tenant: str, version: int) -> PolicyRecord | None:
        """Stored version `version` of the tenant's policy, if the history still has it."""
        found = [record for record in await self.history(tenant) if record.version == version]
        return found[0] if found else None

    async def bases(self, sources: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """What each (tenant, source) last read, for those that read anything, in one
        round trip."""
        if not sources:
            return {}
        keys = [policy_sources_key(validate.tenant_id(tenant)) for tenant, _ in sources]
        with translate_redis_errors("reading policy sources"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, (_, source) in zip(keys, sources, strict=True):
                    pipe.hget(key, source)
                replies = await pipe.execute()
        return {
            pair: reply.decode() if isinstance(reply, bytes) else reply
            for pair, reply in zip(sources, replies, strict=True)
            if reply is not None
        }

    async def read_by(self, tenant: str, source: str, text: str) -> None:
        """Remember that `source` read `text` (a file seen for the first time while the
        store already had a version): its later edits are measured from it."""
        key = policy_sources_key(validate.tenant_id(tenant))
        with translate_redis_errors("recording a policy source"):
            await self.redis.hset(key, source, text)

    async def put(
        self,
        tenant: str,
        *,
        expected: int,
        expected_digest: str,
        digest: str,
        text: str,
        origin: str,
        source: str = "",
        source_text: str = "",
    ) -> PutResult:
        """Write `text` over version `expected` whose digest is `expected_digest` (0
        and '': none yet), stamped with Redis's time; `source` (a host's file) read
        `source_text`, its next edit's base. Over no version, the version written is
        above every one the tenant's accounts hold limits of (policy_put.lua).
        LedgerUnavailable only if the write itself failed: once it landed, a failed
        epoch bump or announcement is logged, not raised (changes.tell)."""
        tenant = validate.tenant_id(tenant)
        keys = [policy_key(tenant), policy_log_key(tenant), policy_sources_key(tenant)]
        keys.append(accounts_key(tenant))
        args = [str(expected), expected_digest, digest, text, origin, source, source_text]
        args.append(str(POLICY_HISTORY))
        with translate_redis_errors("writing a policy"):
            reply = await self.topology.through_migration(lambda: self._put(keys=keys, args=args))
            won, version, stamp = (int(part) for part in reply[:3])
            stored = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
        if won and version != expected:  # else the store held this text already
            await tell(self.redis, POLICY_EPOCH_KEY, "policy")
        return PutResult(bool(won), version, stamp, stored)

    async def announce(self, what: str) -> None:
        """Tell every subscribed gateway (ledger/changes.py) that `what` changed:
        'lease' when a process gave leases up, so the others ask for them now."""
        await announce(self.redis, what)

    async def bump_outcomes(self) -> None:
        """Count one more compensation outcome fleet-wide and announce it: gateways
        then re-read the counts (`epochs`)."""
        with translate_redis_errors("counting an outcome"):
            await bump_epoch(self.redis, OUTCOMES_EPOCH_KEY)
        await announce(self.redis, "outcomes")


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


def _entry(tenant: str, raw: bytes | str) -> PolicyRecord:
    entry = json.loads(raw)
    return PolicyRecord(
        tenant=tenant,
        version=int(entry["v"]),
        digest=str(entry["digest"]),
        text=str(entry["text"]),
        stamp_ms=int(entry["stamp_ms"]),
        origin=str(entry["origin"]),
    )


def _record(tenant: str, fields: dict[str, str]) -> PolicyRecord:
    return PolicyRecord(
        tenant=tenant,
        version=int(fields.get("v", 0)),
        digest=fields.get("digest", ""),
        text=fields.get("text", ""),
        stamp_ms=int(fields.get("stamp_ms", 0)),
        origin=fields.get("origin", ""),
    )
