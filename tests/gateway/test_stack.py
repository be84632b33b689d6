"""irrev/stack.py's gateway, as `irrev demo`, `irrev load` and the benches start it:
its operator decides under a person's name, as a real operator's token names one; and
the harness's servers under it: one run under a command prefix (faketime) leaves no
process behind when stopped, and none starts where something already listens (its
readiness check would pass against that)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from irrev.harness import ProcessError, answers, group_members
from irrev.stack import DEMO_ADMIN_TOKEN, gateway

from .helpers import effect_headers, order
from .servers import BIN, ROOT, Server, base_env, write_policy


def test_the_demos_operator_decides_under_a_persons_name(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    """The demo's admin token was named `operator`, so the journal and every agent
    read `operator:operator` for its decisions (failed before the fix)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    tenant_id = f"stack-{secrets.token_hex(5)}"
    tenant = write_policy(policies, "procurement", tenant_id, f"{suppliers.url}/{tenant_id}")
    with (
        gateway(redis_url, policies, workers=1) as server,
        httpx.Client(base_url=server.url, trust_env=False, timeout=30) as http,
    ):
        escalated = http.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id="s9"),  # above the approval threshold
            headers=effect_headers(tenant, "buyer-01", "big"),
        )
        assert escalated.status_code == 202, escalated.text
        rejected = http.post(
            f"{escalated.headers['location']}/reject",
            headers={"Authorization": f"Bearer {DEMO_ADMIN_TOKEN}"},
        )
        assert rejected.status_code == 200, rejected.text
        assert rejected.json()["by"] == "operator:alice"


def test_a_demo_whose_gateway_refuses_to_start_says_why_without_a_traceback() -> None:
    """`irrev demo` runs `irrev serve` (here asked for WAITAOF, which the demo's Redis
    6.2 lacks): the gateway's line, then the demo's, exit 2 (was a ProcessError
    traceback, exit 1)."""
    demo = subprocess.run(
        [str(BIN / "irrev"), "demo"],
        cwd=ROOT,  # where examples/ is
        env=base_env(IRREV_WAIT_AOF="local"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 2, demo.stderr
    assert "Traceback" not in demo.stderr, demo.stderr
    lines = demo.stderr.splitlines()
    assert "the server has no WAITAOF" in lines[-2], demo.stderr
    assert lines[-1] == "irrev: the gateway exited (2) at start-up", demo.stderr


FAKETIME = shutil.which("faketime")
needs_faketime = pytest.mark.skipif(
    FAKETIME is None, reason="no faketime (apt-get install faketime)"
)


@needs_faketime
def test_a_prefixed_server_stopped_leaves_no_process(tmp_path: Path) -> None:
    """faketime runs its command as its child and passes no signal on: stop() signalled
    faketime alone, and the server it ran stayed on its port (before the fix)."""
    assert FAKETIME is not None
    server = Server(name="a prefixed server", argv=[], env=None, log_path=tmp_path / "server.log")
    server.argv = [FAKETIME, "-f", "+3s", sys.executable, "-m", "http.server"]
    server.argv += [str(server.port), "--bind", "127.0.0.1"]
    server.start("/")
    group = server.pid
    assert len(group_members(group)) == 2  # faketime and the server it runs
    server.stop()
    assert group_members(group) == []
    assert not answers(server.host, server.port)


@pytest.mark.slow
@needs_faketime
def test_a_faketime_gateway_stopped_leaves_no_process(redis_url: str, tmp_path: Path) -> None:
    """stack.gateway with a faketime prefix, as its `prefix` argument offers: once the
    block ends nothing of it runs, and nothing answers on its port (before the fix
    `irrev serve` and its workers went on serving there)."""
    assert FAKETIME is not None
    write_policy(tmp_path, "procurement", f"stack-{secrets.token_hex(5)}", "http://127.0.0.1:9")
    with gateway(redis_url, tmp_path, workers=2, prefix=[FAKETIME, "-f", "+3s"]) as server:
        group = server.pid
        assert len(group_members(group)) >= 4  # faketime, irrev serve, its two workers
    assert group_members(group) == []
    assert not answers(server.host, server.port)


def test_a_start_on_a_port_that_already_answers_is_refused(tmp_path: Path) -> None:
    """A server started where something listens (an orphan of an earlier run, say)
    would pass its readiness check on the other's answers: refused before it starts
    anything."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        marker = tmp_path / "started"
        command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
        server = Server(name="the gateway", argv=command, env=None, log_path=None, port=port)
        with pytest.raises(ProcessError, match=f"already listens on 127.0.0.1:{port}"):
            server.start("/readyz")
    assert server.process is None and not marker.exists()


# A command that starts a server through the harness, from a worker thread as the fault
# matrix does, and never stops it: `term` waits to be signalled (as a CI timeout or an
# operator's `kill` ends `irrev faults`), `exit` leaves at once (as a command whose
# cleanup was skipped by an error does), `fork` first forks a child that exits and
# one that is sent SIGTERM (as a library forking workers might), then says whether
# its server still answers, and leaves. Each cleanup writes the pid it ran in.
ABANDONS = """
import os, signal, sys, threading, time
from pathlib import Path
from irrev.harness import Server, answers, at_exit
marker = Path(sys.argv[2])
at_exit(lambda: marker.open("a").write(f"{os.getpid()}\\n"))
server = Server(name="left running", argv=[], env=None, log_path=None)
server.argv = [sys.executable, "-m", "http.server", str(server.port), "--bind", "127.0.0.1"]
starting = threading.Thread(target=server.start, args=("/",))
starting.start()
starting.join()
print(server.pid, server.port, os.getpid(), flush=True)
if sys.argv[1] == "term":
    time.sleep(120)
if sys.argv[1] == "fork":
    for ending in ("exit", "term"):
        child = os.fork()
        if child == 0:
            if ending == "term":
                time.sleep(120)
            sys.exit(0)
        if ending == "term":
            time.sleep(0.5)
            os.kill(child, signal.SIGTERM)
        os.waitpid(child, 0)
    print(answers("127.0.0.1", server.port), flush=True)
"""


@pytest.mark.parametrize("how", ["term", "exit", "fork"])
def test_a_command_ended_without_stopping_its_servers_leaves_none_running(
    how: str, tmp_path: Path
) -> None:
    """Its servers start in sessions of their own, so neither a SIGTERM to the command
    nor its exit reached them: `irrev faults` killed by SIGTERM left its gateway and
    supplier serving, and its redis-server and work directory (before the fix). SIGTERM
    still ends the command, as SIGTERM. A forked child's exit or SIGTERM stops nothing
    of its parent's: its cleanups are the parent's to run (they ran in the child
    before the fix)."""
    marker = tmp_path / "cleanup"
    command = subprocess.Popen(
        [sys.executable, "-c", ABANDONS, how, str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert command.stdout is not None
    group, port, pid = (int(n) for n in command.stdout.readline().split())
    try:
        if how == "term":
            command.send_signal(signal.SIGTERM)
        if how == "fork":
            assert command.stdout.readline() == "True\n"  # served after its children ended
        assert command.wait(timeout=30) == (-signal.SIGTERM if how == "term" else 0)
        assert group_members(group) == []
        assert not answers("127.0.0.1", port)
        assert marker.read_text() == f"{pid}\n"
    finally:
        command.kill()
        command.stdout.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
