"""The tenant's stress detectors as an operator sees them: one per route with a
`stress` block, read from the ledger and stood at Redis's clock now (pricing's
`cusum_at`), for the admin API and the console."""

from __future__ import annotations

from typing import Any

from ledger import pool_tag
from pricing import Cusum, CusumState, Stress, TenantPolicy, cusum_at, rfc3339


def stressed_routes(policy: TenantPolicy) -> list[tuple[str, Stress]]:
    """The routes of the tenant's catalog that have a detector, by route id."""
    found = {
        route.route_id: route.stress
        for routes in policy.catalog.routes.values()
        for route in routes
        if route.stress is not None
    }
    return sorted(found.items())


def stress_view(
    policy: TenantPolicy, states: dict[str, dict[str, float]], now_ms: int
) -> list[dict[str, Any]]:
    """Each detector: on or off now, its score against its threshold, its calm rate a
    second, when it last tripped and, while on, until when. A detector that has
    seen no request since its settings were set (or a week) is off at its warm-up."""
    out = []
    for route_id, stress in stressed_routes(policy):
        cusum = Cusum(stress.shift, stress.threshold, stress.hold_ticks)
        tick_ms = stress.tick_ms
        now = float(now_ms // tick_ms)
        stored = states.get(pool_tag(route_id), {})
        if stored.get("ms") == tick_ms:
            state = CusumState(
                stored["s"], stored["l"], stored["a"], stored["r"], stored["t"], stored["n"]
            )
        else:
            state = CusumState.warmed(stress.warm_requests, stress.warm_ticks, start=now)
        on, score, calm = cusum_at(state, now, cusum)
        tripped = bool(state.ever_alarmed)
        out.append(
            {
                "route": route_id,
                "on": on,
                "score": round(score, 3),
                "threshold": stress.threshold,
                "calm_per_second": round(calm * 1000 / tick_ms, 6),
                "last_trip_at": rfc3339(int(state.last_alarm) * tick_ms) if tripped else None,
                "on_until": rfc3339(int(state.last_alarm + cusum.hold + 1) * tick_ms)
                if on
                else None,
                "loss_factor": stress.loss_factor,
            }
        )
    return sorted(out, key=lambda d: (not d["on"], d["route"]))
