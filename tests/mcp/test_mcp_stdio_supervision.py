"""The supervisor of a stdio MCP server (gateway/state/mcp_stdio.py) on its own, with real
processes that misbehave: one that exits at once is restarted up to the bound, then
refused at once; one that never finishes the handshake is killed at the start timeout;
closing the connection refuses the calls waiting for it; a server a reload retired
is stopped by a shutdown in its grace, before the shutdown ends. Each command appends
its pid to a file, so the test sees every process it started."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from gateway.state.mcp_stdio import Command, StdioConnection
from gateway.state.mcp_upstream import McpUpstream, NotSent
from gateway.state.supervision import Supervision
from gateway.state.upstreams import Upstreams

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = Supervision(max_restarts=2, window_s=60, backoff_s=0.01, start_timeout_s=5)


def misbehaving(pids: Path, then: str) -> Command:
    """A process that records its pid, then does `then` (Python) instead of MCP."""
    script = f"import os; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); {then}"
    return Command((sys.executable, "-c", script))


def started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def refusal(connection: StdioConnection, within_s: float = 5.0) -> NotSent:
    with pytest.raises(NotSent) as refused:
        async with connection.open(time.monotonic() + within_s):
            pass
    return refused.value


async def test_a_server_that_exits_at_once_is_restarted_up_to_the_bound(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    connection = StdioConnection(misbehaving(pids, "raise SystemExit(3)"), "t/exits", FAST)
    try:
        first = await refusal(connection)
        assert first.why == "process_not_started"
        assert "exited (or closed its standard output) before the MCP handshake" in str(first)
        whys = [first.why]
        deadline = time.monotonic() + 10
        while whys[-1] != "process_restart_limit":
            assert time.monotonic() < deadline, whys
            whys.append((await refusal(connection)).why)
        # The first start and the two restarts the bound allows; refused at once now.
        assert len(started(pids)) == 1 + FAST.max_restarts
        quick = time.monotonic()
        down = await refusal(connection, within_s=30)
        assert down.why == "process_restart_limit" and time.monotonic() - quick < 1
        assert "after 2 restarts within 60 s" in str(down)
    finally:
        await connection.aclose()


async def test_a_server_that_never_answers_is_killed_at_the_start_timeout(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    rules = Supervision(max_restarts=0, window_s=60, start_timeout_s=0.5)
    connection = StdioConnection(misbehaving(pids, "import time; time.sleep(60)"), "t/mute", rules)
    try:
        refused = await refusal(connection)
        assert refused.why == "process_not_started"
        assert "no MCP handshake within 0.5 s" in str(refused)
        (pid,) = started(pids)
        deadline = time.monotonic() + 10
        while alive(pid):
            assert time.monotonic() < deadline, "the mute server was never stopped"
            await asyncio.sleep(0.05)
        # No restarts allowed: down for a window.
        assert (await refusal(connection)).why == "process_restart_limit"
    finally:
        await connection.aclose()


async def test_closing_refuses_the_calls_waiting_for_the_process(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # It reads its input to the end, as stdio servers do, and never answers.
    connection = StdioConnection(
        misbehaving(pids, "import sys; sys.stdin.read()"), "t/slow", Supervision()
    )
    waiting = asyncio.create_task(refusal(connection, within_s=30))
    deadline = time.monotonic() + 10
    while not started(pids):
        assert time.monotonic() < deadline, "never started"
        await asyncio.sleep(0.05)
    await connection.aclose()
    assert (await waiting).why == "process_stopped"
    assert not [pid for pid in started(pids) if alive(pid)]


@pytest.mark.parametrize("retire_started", [True, False], ids=["retiring", "just-retired"])
async def test_a_shutdown_stops_a_retired_server_that_takes_its_time(
    tmp_path: Path, retire_started: bool
) -> None:
    """A shutdown cancels a retire again until it ends (ledger.stop_tasks); a process
    that stops 1 s after its input closes is still waited for, not left running past
    the shutdown. Also when the shutdown comes before the retire's task ever ran (a
    reload, then a SIGTERM in the same turn of the loop): cancelled unstarted, it
    closed nothing, and the process outlived the gateway."""
    pids = tmp_path / "pids"
    upstreams = Upstreams(Supervision())
    command = misbehaving(pids, "import sys, time; sys.stdin.read(); time.sleep(1)")
    retired = McpUpstream(StdioConnection(command, "t/lingers", Supervision()))
    upstreams.mcp = {("t", "lingers"): retired}
    # A call waiting for the process keeps the retired server busy through its grace.
    call = asyncio.create_task(retired.list_tools(time.monotonic() + 30, ttl_s=0))
    deadline = time.monotonic() + 10
    while not started(pids):
        assert time.monotonic() < deadline, "never started"
        await asyncio.sleep(0.05)
    upstreams.rebuild([], {}, grace_s=60)
    if retire_started:
        # Turns of the loop, not time: the retire's task, then its gather's child, take
        # their first steps, and it waits out its grace.
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.wait_for(upstreams.aclose(), timeout=10)
    assert not [pid for pid in started(pids) if alive(pid)]
    assert await asyncio.wait_for(call, timeout=10) == []
