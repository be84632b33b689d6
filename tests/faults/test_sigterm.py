"""`irrev faults` sent SIGTERM mid-cell (a CI timeout, an operator's `kill`) leaves
no process of its own running. The escrow cells' spenders share its process group,
so a SIGTERM to it alone used to leave them spending and retrying a Redis the
harness had stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from irrev.harness import group_members
from ledger import Escrow, Ledger

pytestmark = pytest.mark.slow

WORKER = b"irrev.faults.escrow_worker"


def spenders(group: int) -> dict[int, list[str]]:
    """The escrow workers among the live processes of `group`, and their arguments."""
    found = {}
    for pid in group_members(group):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if WORKER in argv:
            found[pid] = [a.decode() for a in argv[argv.index(WORKER) + 1 :]]
    return found


async def spending(url: str, tenant: str) -> None:
    """Until the spenders have taken budget: past their start, in their loop."""
    ledger = Ledger.from_url(url)
    try:
        escrow = await Escrow.of(ledger, tenant)
        while await escrow.used("tenant:acme") == 0:
            await asyncio.sleep(0.02)
    finally:
        await ledger.aclose()


async def test_sigterm_mid_escrow_cell_leaves_no_spender_running() -> None:
    """The matrix in a process group of its own, which its spenders share: after its
    SIGTERM, nothing of that group may be left."""
    argv = ["faults", "--runs", "20", "--cells", "escrow.concurrent_reclaims"]
    matrix = subprocess.Popen(
        [str(Path(sys.executable).parent / "irrev"), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (started := spenders(matrix.pid)):
            assert matrix.poll() is None, "the matrix ended before any spender started"
            assert time.monotonic() < deadline, "no spender started within 120 s"
            await asyncio.sleep(0.05)
        url, tenant = next(iter(started.values()))[:2]
        await asyncio.wait_for(spending(url, tenant), 60)
        os.kill(matrix.pid, signal.SIGTERM)
        assert await asyncio.to_thread(matrix.wait, 60) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while (left := group_members(matrix.pid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not left, f"still running after the matrix's SIGTERM: {spenders(matrix.pid)}"
    finally:
        if matrix.poll() is None:
            matrix.kill()
            matrix.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(matrix.pid, signal.SIGKILL)
