"""A Ledger's stress detectors: one per route of a tenant, shared by every gateway."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import validate
from .errors import raise_for_reply, translate_redis_errors
from .keys import (
    accounts_key,
    hold_key,
    journal_key,
    margins_key,
    settled_key,
    stress_alarms_key,
    stress_key,
)
from .records import Margin, StressDetector, StressReading, pool_tag
from .replies import decoded

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object

# A tenant's detectors are forgotten a week after its last request through any of
# them: a detector that wakes from that long a sleep starts again from its warm-up.
DETECTOR_TTL_MS = 7 * 24 * 3600 * 1000


class Detectors(LedgerCore):
    """Stress detectors (a mixin of Ledger)."""

    async def stress_step(
        self, tenant: str, route_id: str, detector: StressDetector, hold_id: str
    ) -> StressReading:
        """Count the request that would open `hold_id` on `route_id` in its detector
        (lua/detector.lua), by Redis's clock, and answer whether to price it stressed.
        A repeat (the hold is kept, or archived with its id still taken) is not
        counted again: the answer is the detector as it stands (`counted` False)."""
        tenant = validate.tenant_id(tenant)
        tag = pool_tag(route_id)
        keys = [accounts_key(tenant), journal_key(tenant), stress_key(tenant)]
        keys += [stress_alarms_key(tenant, tag), hold_key(tenant, hold_id), settled_key(tenant)]
        d = detector
        args = [tag, str(d.tick_ms), repr(float(d.shift)), repr(float(d.h))]
        args += [str(d.hold), repr(float(d.warm_requests)), repr(float(d.warm_ticks))]
        args += [str(DETECTOR_TTL_MS), route_id, hold_id]
        reply = await self._run("detector", keys, args)
        raise_for_reply(tenant, hold_id, "stress detector", reply)
        on, run, tick, score, calm, alarm, ended, ended_at, tripped, cleared, counted = reply[1:]
        return StressReading(
            on=int(on) == 1,
            run=int(float(run)),
            tick=int(float(tick)),
            score=float(score),
            calm=float(calm),
            alarm=int(alarm) == 1,
            ended=int(ended) == 1,
            ended_at=int(float(ended_at)),
            tripped=int(tripped) == 1,
            cleared=int(cleared) == 1,
            counted=int(counted) == 1,
        )

    async def stress_states(self, tenant: str) -> dict[str, dict[str, float]]:
        """The tenant's detectors as they were at their last request, by route tag
        (`pool_tag`): score s, last tick l, last alarm a, calm requests r and ticks t,
        run n, on (1 or 0), the tick length ms, the newest run trimmed from its alarms
        (cut, if any) and the settings it runs on: shift, h and hold (lua/detector.lua)."""
        with translate_redis_errors("stress detectors"):
            stored = await decoded(self.redis.hgetall(stress_key(validate.tenant_id(tenant))))
        states: dict[str, dict[str, float]] = {}
        for name, value in stored.items():
            tag, _, field = name.rpartition("|")
            if field == "cfg":  # shift, h, hold, warm-up requests and ticks
                for key, number in zip(("shift", "h", "hold"), value.split(","), strict=False):
                    states.setdefault(tag, {})[key] = float(number)
            else:
                states.setdefault(tag, {})[field] = float(value)
        return states

    async def alarmed_runs(self, tenant: str, tag: str, runs: Sequence[int]) -> set[int]:
        """Which of `runs` of the route tagged `tag` ended in an alarm (lua/detector.lua):
        those in its alarms, and any at or below the newest run trimmed from them."""
        tenant = validate.tenant_id(tenant)
        if not runs:
            return set()
        with translate_redis_errors("stress alarms"):
            scores = await self.redis.zmscore(stress_alarms_key(tenant, tag), list(map(str, runs)))
            cut = await self.redis.hget(stress_key(tenant), f"{tag}|cut")
        below = float(cut) if cut is not None else -1.0
        return {r for r, s in zip(runs, scores, strict=True) if s is not None or r <= below}

    async def keep_margin(self, tenant: str, margin: Margin) -> None:
        """Note a hold that keeps a stress margin (before its reserve: one noted for a
        hold that was never kept is dropped by `drop_margins` when it is not found)."""
        with translate_redis_errors("stress margins"):
            await self.redis.zadd(margins_key(validate.tenant_id(tenant)), {margin.member: 0})

    async def margins(self, tenant: str) -> list[Margin]:
        """Every hold of the tenant noted as keeping a stress margin."""
        with translate_redis_errors("stress margins"):
            members = [
                m async for m in self.redis.zscan_iter(margins_key(validate.tenant_id(tenant)))
            ]
        return [Margin.parse(m[0] if isinstance(m, tuple) else m) for m in members]

    async def drop_margins(self, tenant: str, margins: Sequence[Margin]) -> None:
        if margins:
            with translate_redis_errors("stress margins"):
                key = margins_key(validate.tenant_id(tenant))
                await self.redis.zrem(key, *(m.member for m in margins))
