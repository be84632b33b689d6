"""Stress margins released: a hold admitted while its route's burst detector was off
was held at its stressed price (pipeline/reserve.py's `under_stress`), and is lowered
to its calm price once the detector vouches for it: its run of the CUSUM ended calm
(pricing's `margin_kept`). One whose run alarmed was one of a burst's first requests,
priced before any detector could see the burst; it keeps its stressed price until it
settles. The tenant's sweeper does this every round (gateway/state/sweeper.py), so a
margin comes back at most a sweep interval after its run ended.

Every step errs towards holding: a margin noted for a hold that was never kept, or
whose hold settled, is dropped; a detector whose state is gone (a week without a
request) vouches for nothing, and its holds keep their margins until they settle."""

from __future__ import annotations

from collections import defaultdict

from ledger import HoldNotFound, HoldState, HoldStateConflict, Ledger, Margin, Status
from pricing import Cusum, CusumState, margin_kept

# A hold keeps its margin while it can still be posted at its price.
LIVE = frozenset({HoldState.PENDING, HoldState.AMBIGUOUS, HoldState.ESCALATED})


async def release_margins(ledger: Ledger, tenant: str) -> int:
    """Lower every hold of the tenant whose detector vouched for it to its calm price,
    forget the margins of settled holds; the number lowered."""
    noted = await ledger.margins(tenant)
    if not noted:
        return 0
    states = await ledger.stress_states(tenant)
    now_ms = await ledger.now_ms()
    by_tag: dict[str, list[Margin]] = defaultdict(list)
    for margin in noted:
        by_tag[margin.tag].append(margin)
    done: list[Margin] = []
    counted: list[Margin] = []  # kept until their holds settle
    lowered = 0
    for tag, margins in by_tag.items():
        stored = states.get(tag, {})
        if "ms" not in stored:
            counted += margins
            continue
        runs = sorted({m.run for m in margins})
        alarmed = await ledger.alarmed_runs(tenant, tag, runs)
        cusum = Cusum(stored["shift"], stored["h"], int(stored["hold"]))
        state = CusumState.stored(stored)
        tick = float(now_ms // int(stored["ms"]))
        for m in margins:
            if m.run in alarmed:
                counted.append(m)
                continue
            if margin_kept(state, cusum, tick, m.run, alarmed=False):
                continue  # its run is open: decided in a later round
            try:
                result = await ledger.shrink(tenant, m.hold_id, m.calm)
                lowered += result.status is Status.OK
            except (HoldStateConflict, HoldNotFound):
                pass  # settled (or never kept): what it charges is final
            done.append(m)
    holds = await ledger.holds(tenant, [m.hold_id for m in counted])
    done += [m for m in counted if m.hold_id not in holds or holds[m.hold_id].state not in LIVE]
    await ledger.drop_margins(tenant, done)
    return lowered
