"""A tenant's sweeper releasing stress margins, as a process of its own, for
tests/gateway/test_margin_crashes.py to SIGKILL midway.

Run as `python -m tests.gateway.margin_sweeper URL TENANT` from the repository root:
it runs gateway/state/margins.py's `release_margins` round after round until the
tenant has no margin noted, then prints how many holds it lowered.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.state.margins import release_margins
from ledger import Ledger


async def sweep(url: str, tenant: str) -> int:
    ledger = Ledger.from_url(url)
    lowered = 0
    try:
        while await ledger.margins(tenant):
            lowered += await release_margins(ledger, tenant)
    finally:
        await ledger.aclose()
    return lowered


if __name__ == "__main__":
    print(asyncio.run(sweep(sys.argv[1], sys.argv[2])), flush=True)
