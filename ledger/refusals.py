"""Refusal counts: how many requests the gateway refused, per tenant and minute (Redis's
clock), by reason, transport, agent and route, added to by every gateway process of the
fleet. One hash per tenant and minute (`irrev:{<tenant>}:refusals:<minute>`, keys.py),
which expires KEEP_MS after its last write: an operator's last hour, never a history.

A process adds what it counted since its last call in one round trip for every tenant
(a pipeline of lua/refusals.lua, one call per tenant and minute); the script keeps each
hash to MAX_FIELDS fields (plus one fallback per reason and transport), whatever the
number of processes. Like lease.lua and policy_put.lua it is a plain EVALSHA script
outside the ledger's Functions library (ledger/scripts.py): it uses nothing of
_lib.lua and its key is no ledger key."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from redis import exceptions as redis_errors

from . import validate
from .cluster import RedisClient
from .errors import BadInput, translate_redis_errors
from .keys import refusals_key

log = logging.getLogger("irrev.ledger")
MINUTE_MS = 60_000
# An hour of whole minutes, and the minute in progress, with a minute to spare.
KEEP_MS = 62 * MINUTE_MS
MAX_FIELDS = 1000
# A field's parts are joined by '|'; the route, last, may hold one.
SEPARATOR = "|"
OTHERS = "*"
MAX_PART_CHARS = 256


@dataclass(frozen=True, slots=True)
class RefusalCount:
    """`count` refusals of `reason` given over `transport` ('http', 'mcp') to `agent`
    calling `route`; agent and route are '*' for those counted past MAX_FIELDS."""

    reason: str
    transport: str
    agent: str
    route: str
    count: int

    @property
    def field(self) -> str:
        return SEPARATOR.join((self.reason, self.transport, self.agent, self.route))

    @property
    def fallback(self) -> str:
        return SEPARATOR.join((self.reason, self.transport, OTHERS, OTHERS))


def _checked(count: RefusalCount) -> RefusalCount:
    for name in ("reason", "transport", "agent"):
        part = getattr(count, name)
        if not part or SEPARATOR in part or len(part) > MAX_PART_CHARS:
            raise BadInput(name, f"must be 1-{MAX_PART_CHARS} characters without '|'")
    if not count.route or len(count.route) > MAX_PART_CHARS:
        raise BadInput("route", f"must be 1-{MAX_PART_CHARS} characters")
    if count.count <= 0:
        raise BadInput("count", "must be a positive integer")
    return count


def _parsed(field: str, value: str) -> RefusalCount | None:
    parts = field.split(SEPARATOR, 3)
    if len(parts) != 4 or not value.isdigit():
        return None  # not written by refusals.lua: never a 500 for what Redis holds
    reason, transport, agent, route = parts
    return RefusalCount(reason, transport, agent, route, int(value))


class RefusalCounts:
    def __init__(self, redis: RedisClient, *, max_fields: int = MAX_FIELDS) -> None:
        self.redis = redis
        self.max_fields = max_fields
        self._source = files("ledger.lua").joinpath("refusals.lua").read_text(encoding="utf-8")
        self._sha = hashlib.sha1(self._source.encode()).hexdigest()

    async def add(self, minute: int, counts: Mapping[str, Sequence[RefusalCount]]) -> int:
        """Add each tenant's `counts` to `minute` (minutes since the epoch) in one round
        trip (two if Redis had to be given the script first); returns Redis's clock
        (ms) as the last call read it, 0 if none was counted. LedgerUnavailable if the
        round trip failed (then nothing, or in a connection lost midway a part, was
        counted)."""
        calls = [
            (refusals_key(validate.tenant_id(tenant), minute), self._args(batch))
            for tenant, batch in counts.items()
            if batch
        ]
        if not calls:
            return 0
        with translate_redis_errors("counting refusals"):
            replies = await self._pipeline(calls)
            missing = [
                i for i, r in enumerate(replies) if isinstance(r, redis_errors.NoScriptError)
            ]
            if missing:  # a restarted or new server forgot it
                await self.redis.script_load(self._source)
                again = await self._pipeline([calls[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        # A call Redis refused (out of memory, say) is not sent again: the others of the
        # round trip were counted, and a count is telemetry, not budget.
        for (key, _), reply in zip(calls, replies, strict=True):
            if isinstance(reply, Exception):
                log.warning("refusal counts not kept", extra={"key": key, "why": str(reply)})
        counted = [r for r in replies if not isinstance(r, Exception)]
        if not counted:
            return 0
        _, seconds, micros = counted[-1]
        return int(seconds) * 1000 + int(micros) // 1000

    def _args(self, batch: Sequence[RefusalCount]) -> list[str]:
        args = [str(KEEP_MS), str(self.max_fields)]
        for count in map(_checked, batch):
            args += [count.field, count.fallback, str(count.count)]
        return args

    async def _pipeline(self, calls: list[tuple[str, list[str]]]) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, args in calls:
                # Not pipe.evalsha, which the cluster client refuses in a pipeline: a
                # command with its key routes by that key like any other.
                pipe.execute_command("EVALSHA", self._sha, 1, key, *args)
            return list(await pipe.execute(raise_on_error=False))

    async def read(self, tenant: str, minutes: Sequence[int]) -> dict[int, list[RefusalCount]]:
        """The counts of each of `minutes` (all of one tenant: one slot), in one round
        trip; a minute nobody counted in (or expired) has an empty list."""
        tenant = validate.tenant_id(tenant)
        with translate_redis_errors("reading refusal counts"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for minute in minutes:
                    pipe.hgetall(refusals_key(tenant, minute))
                replies = await pipe.execute()
        out: dict[int, list[RefusalCount]] = {}
        for minute, stored in zip(minutes, replies, strict=True):
            found = (_parsed(_text(k), _text(v)) for k, v in stored.items())
            out[minute] = [count for count in found if count is not None]
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
