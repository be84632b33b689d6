"""LangGraph 1.2 with its SQLite checkpointer, real processes and real SIGKILL: the
"Resume Means Resume" failure cells, without irrev and through it, with the
tool API a server that pays every request (tests/clients/payments.py). The graph is
examples/clients/langgraph_checkout.py (approve: an interrupt; pay: a charge), run
one process per phase by tests/clients/checkout_run.py. No model, no network.

- Crash: a run is killed after its `pay` node's charge was answered and before the
  step's checkpoint is written, then continued in a new process.
- Concurrent resume: K processes resume one parked interrupt at once.

Each test asserts the payments it counts; docs/clients.md has the figures and the
commands. The keys compared: `step` (irrev.langgraph.step_key_of), `task`
(LangGraph's task id), `uuid` (a new one per call), and `none` (the tool API called
directly, no irrev)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from .conftest import Payments, fresh

ROOT = Path(__file__).resolve().parents[2]
RESUMERS = 8
PROCESS_TIMEOUT_S = 120


@dataclass
class Checkout:
    """One checkout thread: its SQLite file, its customer, how `pay` is keyed."""

    payments: Payments
    root: Path
    key: str
    thread: str = ""
    customer: str = ""

    def __post_init__(self) -> None:
        self.thread, self.customer = fresh("thread"), fresh("cus")

    def argv(self, phase: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tests.clients.checkout_run",
            phase,
            "--thread",
            self.thread,
            "--db",
            str(self.root / "checkpoints.sqlite"),
            "--key",
            self.key,
            "--gateway",
            self.payments.gateway.url,
            "--token",
            self.payments.tenant.tokens["checkout-01"],
            "--tool-api",
            self.payments.tool_api.url,
            "--customer",
            self.customer,
            *extra,
        ]

    def spawn(self, phase: str, *extra: str) -> subprocess.Popen[str]:
        """A phase's process: its stdin and stdout are pipes, its stderr a log."""
        with open(self.root / f"{phase}-{time.monotonic_ns()}.log", "w") as log:
            return subprocess.Popen(
                self.argv(phase, *extra),
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )

    def run(self, phase: str) -> dict[str, Any]:
        """A phase run to its end; the graph's state (or interrupt) it printed."""
        done = subprocess.run(
            self.argv(phase), cwd=ROOT, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return dict(json.loads(done.stdout.splitlines()[-1]))

    async def charges(self) -> int:
        return len(await self.payments.made(customer=self.customer))


def wait_for(path: Path, process: subprocess.Popen[str]) -> None:
    """Until `path` exists (the node's marker), while `process` lives."""
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while not path.exists():
        assert process.poll() is None, f"the run ended ({process.returncode}) before paying"
        assert time.monotonic() < deadline, "the run never paid"
        time.sleep(0.02)


def reap(process: subprocess.Popen[str]) -> None:
    """SIGKILL it if it still runs; wait for it and close its pipes."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=PROCESS_TIMEOUT_S)
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


def read_line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


@pytest.mark.slow
@pytest.mark.parametrize(("key", "paid"), [("none", 2), ("uuid", 2), ("step", 1)])
async def test_a_run_killed_after_its_payment_then_resumed(
    key: str, paid: int, payments: Payments, tmp_path: Path
) -> None:
    checkout = Checkout(payments, tmp_path, key)
    parked = await asyncio.to_thread(checkout.run, "start")
    assert "__interrupt__" in parked, parked
    marker = tmp_path / "paid"
    dying = checkout.spawn("resume", "--crash-marker", str(marker))
    try:
        await asyncio.to_thread(wait_for, marker, dying)
    finally:
        reap(dying)  # SIGKILL: after the charge, before the step's checkpoint
    first = json.loads(marker.read_text())["charge"]
    assert await checkout.charges() == 1  # the charge was made before the kill
    resumed = await asyncio.to_thread(checkout.run, "continue")
    assert resumed["approved"] and "charge" in resumed, resumed
    assert await checkout.charges() == paid
    # Through irrev, the resumed run holds the charge the killed one made.
    assert (resumed["charge"] == first) == (paid == 1)


@pytest.mark.slow
@pytest.mark.parametrize(("key", "paid"), [("none", RESUMERS), ("task", RESUMERS), ("step", 1)])
async def test_k_processes_resume_one_parked_interrupt(
    key: str, paid: int, payments: Payments, tmp_path: Path
) -> None:
    checkout = Checkout(payments, tmp_path, key)
    await asyncio.to_thread(checkout.run, "start")
    resumers = [checkout.spawn("resume", "--barrier") for _ in range(RESUMERS)]
    try:
        # All read the parked state at once: each waits for "go" once it is ready.
        for process in resumers:
            assert await asyncio.to_thread(read_line, process.stdout) == "ready"
        for process in resumers:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        ends = [
            await asyncio.to_thread(process.communicate, timeout=PROCESS_TIMEOUT_S)
            for process in resumers
        ]
    finally:
        for process in resumers:
            reap(process)
    finals = [json.loads(out.splitlines()[-1]) for out, _ in ends if out.strip()]
    assert all(p.returncode == 0 for p in resumers), [p.returncode for p in resumers]
    assert await checkout.charges() == paid, finals
    if paid == 1:  # every resumer holds the one charge
        assert len({json.dumps(final["charge"]) for final in finals}) == 1, finals
