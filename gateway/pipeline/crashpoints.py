"""Deterministic crash points, a test hook for the fault matrix (`irrev faults`).

Off unless `IRREV_CRASH_AT` names a point when the worker starts; then the worker
SIGKILLs itself the first time it reaches that point, as a real crash would (no
cleanup, no `finally`, no response). Never set it in production.

Points:
- `after_reserve`: an effect was admitted (hold pending, armed), not yet forwarded.
- `after_upstream_2xx`: the upstream answered 2xx, the hold is not yet posted.
- `after_claim`: an approval won the consume-once claim, the effect is not forwarded.

"After forwarding, before the upstream answers" needs no hook: the harness makes the
upstream wait and kills the worker from outside while it waits.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "IRREV_CRASH_AT"
POINTS = frozenset({"after_reserve", "after_upstream_2xx", "after_claim"})
_ARMED = os.environ.get(CRASH_ENV, "")


def crash_point(name: str) -> None:
    """Die here, by SIGKILL, if `IRREV_CRASH_AT` names this point."""
    assert name in POINTS, name
    if name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
