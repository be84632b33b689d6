"""A tenant's sweeper releasing stress margins, as a process of its own, for
tests/gateway/test_margin_crashes.py to SIGKILL midway.

Run as `python -m tests.gateway.margin_sweeper URL TENANT` from the repository root:
it runs gateway/state/margins.py's `release_margins` round after round until the
tenant has no margin noted.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.state.margins import release_margins
from ledger import Ledger


async def sweep(url: str, tenant: str) -> None:
    ledger = Ledger.from_url(url)
    try:
        while await ledger.margins(tenant):
            await release_margins(ledger, tenant)
    finally:
        await ledger.aclose()


if __name__ == "__main__":
    asyncio.run(sweep(sys.argv[1], sys.argv[2]))
