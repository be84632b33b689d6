"""`irrev serve` as an operator meets it: real processes and real signals. It keeps
the embedded redis-server it started running (kill -9 -> started again on the same
AOF), releases it on SIGTERM, refuses to start (one line on stderr, exit code 2, no
process left) when its workers cannot reach Redis, on an address in use, a Redis it
cannot use (a redis-server it cannot run, a data directory it cannot create, a URL
that is not Redis's), a missing policy directory and a policy that could never
forward, and reconcile survives a removed route."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO

import httpx
import pytest
import yaml

from irrev.harness import free_port
from ledger import EmbeddedRedis
from tests.ledger.test_embedded import process_gone, wait_until

from .conftest import Gateway, own_gateway
from .helpers import assert_problem, base_of, effect_headers, order
from .servers import BIN, Server, Tenant, base_env, write_policy

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

STOP_DEADLINE_S = 30.0


def redis_pid(data_dir: Path) -> int:
    return int(json.loads((data_dir / "embedded.json").read_text())["pid"])


def recorded_pid(data_dir: Path) -> int | None:
    """The pid embedded.json records, or None while there is none."""
    try:
        return redis_pid(data_dir)
    except FileNotFoundError:
        return None


def admitted(url: str, tenant: Tenant, key: str) -> bool:
    try:
        response = httpx.post(
            f"{url}/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "buyer-01", key),
            timeout=10,
            trust_env=False,
        )
    except httpx.TransportError:
        return False
    return response.status_code == 201


def test_serve_supervises_its_embedded_redis(
    redis_binary: Path, suppliers: Server, tmp_path: Path
) -> None:
    """Observation 13: after kill -9 of the redis-server it started, `irrev serve`
    starts it again and serves; SIGTERM stops the workers and the redis-server."""
    data_dir, policies = tmp_path / "data", tmp_path / "policies"
    policies.mkdir()
    tenant = write_policy(
        policies, "procurement", "served", f"{suppliers.url}/served-{os.getpid()}"
    )
    env = base_env(
        IRREV_DATA_DIR=str(data_dir),
        IRREV_REDIS_SERVER=str(redis_binary),
        IRREV_POLICY_DIR=str(policies),
        # Bounds the workers' shutdown: the upstream timeout plus a 5 s margin.
        IRREV_UPSTREAM_TIMEOUT_S="1",
        IRREV_FORWARD_MARGIN_S="0.5",
    )
    server = Server(
        name="irrev serve",
        argv=[str(BIN / "irrev"), "serve"],
        env=env,
        log_path=tmp_path / "serve.log",
    )
    server.argv += ["--port", str(server.port), "--workers", "2"]
    server.start("/readyz")
    wait_until(lambda: len(worker_pids(server)) == 2, "both workers to start")
    first = redis_pid(data_dir)
    try:
        assert admitted(server.url, tenant, "before")
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: process_gone(first), "the killed redis-server to be gone")
        wait_until(lambda: admitted(server.url, tenant, "after"), "the gateway to serve again")
        # The restarted server's record is written once it answers, so the gateway may
        # serve before it exists (read too early here once, in a CI run).
        wait_until(lambda: recorded_pid(data_dir) not in (None, first), "its new record")
        second = redis_pid(data_dir)
        assert second != first and not process_gone(second)

        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=STOP_DEADLINE_S) == 0, server.log()
        wait_until(lambda: process_gone(second), "the embedded redis-server to stop")
        workers = worker_pids(server)
        assert len(workers) >= 2 and all(process_gone(pid) for pid in workers)
    finally:
        server.stop()
        if (data_dir / "embedded.json").exists() and not process_gone(redis_pid(data_dir)):
            os.kill(redis_pid(data_dir), signal.SIGKILL)  # ours: a failed test leaves none


def worker_pids(server: Server) -> set[int]:
    assert server.log_path is not None
    lines = server.log_path.read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    return {int(e["pid"]) for e in entries if e.get("msg") == "gateway ready"}


def run_irrev(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "irrev"), *argv],
        env=base_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def in_session(
    command: list[str], env: dict[str, str], stdout: int, stderr: int | IO[str] = subprocess.PIPE
) -> subprocess.Popen[str]:
    """`command` in a session of its own (so that every process it starts can be
    found and killed), its stderr read as text (or written to `stderr`)."""
    return subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def refused_start(*argv: str, **env: str) -> str:
    """Run `irrev serve` (on a free port) that must refuse to start: exit code 2, and
    on stderr one line `irrev: ...` (no traceback: the reason is the line, once however
    many workers met it), and no process of its session left behind (workers, an
    embedded redis-server). Returns the line."""
    command = [str(BIN / "irrev"), "serve", "--port", str(free_port()), *argv]
    with in_session(command, base_env(**env), stdout=subprocess.PIPE) as process:
        try:
            _, stderr = process.communicate(timeout=STOP_DEADLINE_S * 2)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("irrev: "), stderr
    wait_until(lambda: not session_members(process.pid), "the session's processes to exit")
    return lines[0]


def session_members(session: int) -> list[int]:
    """The live processes (not zombies) of a session."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(stat.parent.name))
    return members


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_to_start_without_redis(workers: str, tmp_path: Path) -> None:
    """Observation 2 (last clause): workers that cannot reach Redis are a failed serve,
    said once whatever the number of workers."""
    write_policy(tmp_path, "procurement", "unstartable", "http://127.0.0.1:9")
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    line = refused_start(
        "--workers", workers, IRREV_POLICY_DIR=str(tmp_path), IRREV_REDIS_URL=nobody
    )
    assert line.startswith("irrev: cannot reach Redis"), line
    assert "IRREV_REDIS_URL" in line, line


def test_a_worker_that_dies_while_redis_is_down_stops_serve_saying_so(tmp_path: Path) -> None:
    """A worker killed while Redis is away is started again, and the new one cannot
    reach Redis: the gateway stops (a supervisor restarts it), and its line says that
    a worker died, not that the gateway could not start (a hostile review: after hours
    of serving, the operator saw a start-up refusal and nothing of the death)."""
    write_policy(tmp_path, "procurement", "replaced", "http://127.0.0.1:9")
    port = free_port()
    command = [str(BIN / "irrev"), "serve", "--port", str(port), "--workers", "2"]
    log = tmp_path / "serve.log"
    with EmbeddedRedis(tmp_path / "redis", tcp=True) as server, log.open("w") as written:
        env = base_env(IRREV_POLICY_DIR=str(tmp_path), IRREV_REDIS_URL=server.url)
        process = in_session(command, env, subprocess.DEVNULL, written)
        try:
            # Both workers: one still starting when Redis goes away fails its start-up,
            # which serve reports as such (a CI run saw exactly that).
            wait_until(
                lambda: log.read_text().count('"msg": "gateway ready"') == 2,
                "both workers to serve",
            )
            server.kill()
            os.kill(_workers(process.pid)[0], signal.SIGKILL)
            process.wait(timeout=STOP_DEADLINE_S * 2)
        finally:
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)
    stderr = log.read_text()
    assert process.returncode == 2, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("irrev: a worker died and the one started in its place"), stderr
    assert "cannot reach Redis" in last, stderr
    wait_until(lambda: not session_members(process.pid), "the session's processes to exit")


def _workers(parent: int) -> list[int]:
    """The uvicorn workers `parent` spawned (not its multiprocessing resource tracker)."""
    found = []
    for pid in session_members(parent):
        stat = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the stat's fourth field
        if ppid == parent and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            found.append(pid)
    return found


def test_serve_refuses_an_address_in_use(tmp_path: Path) -> None:
    write_policy(tmp_path, "procurement", "unstartable", "http://127.0.0.1:9")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        line = refused_start(
            "--port",
            port,
            IRREV_POLICY_DIR=str(tmp_path),
            IRREV_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        )
    assert line.startswith(f"irrev: cannot listen on 127.0.0.1:{port}"), line
    assert "--port" in line, line


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("IRREV_REDIS_SERVER", "is not an executable file; fix or unset IRREV_REDIS_SERVER"),
        ("IRREV_DATA_DIR", "(Not a directory): fix IRREV_DATA_DIR, or set IRREV_REDIS_URL"),
        ("IRREV_REDIS_URL", "IRREV_REDIS_URL: Value error, must be a redis://, rediss:// or"),
    ],
)
def test_serve_refuses_a_redis_it_cannot_use(setting: str, said: str, tmp_path: Path) -> None:
    """A redis-server it cannot run, a data directory it cannot create (under a file),
    a URL that is not Redis's."""
    write_policy(tmp_path / "policies", "procurement", "unstartable", "http://127.0.0.1:9")
    (tmp_path / "file").write_text("")
    wrong = {
        "IRREV_REDIS_SERVER": str(tmp_path / "no-redis-server"),
        "IRREV_DATA_DIR": str(tmp_path / "file" / "data"),
        "IRREV_REDIS_URL": f"http://127.0.0.1:{free_port()}",
    }
    settings = {"IRREV_DATA_DIR": str(tmp_path / "data"), setting: wrong[setting]}
    line = refused_start(IRREV_POLICY_DIR=str(tmp_path / "policies"), **settings)
    assert said in line, line


def test_serve_refuses_a_missing_policy_directory(tmp_path: Path) -> None:
    line = refused_start(IRREV_POLICY_DIR=str(tmp_path / "none"))
    assert line.endswith("not a directory of policy files"), line


def test_a_hold_ttl_shorter_than_a_forward_is_refused_by_serve_and_validate(
    tmp_path: Path,
) -> None:
    """Observation 12: checked against the settings in force (here a 30 s upstream
    timeout, the default 5 s margin), before any effect gets 503 hold_deadline."""
    write_policy(tmp_path, "procurement", "short", "http://127.0.0.1:9", hold_ttl="20s")
    settings = {"IRREV_UPSTREAM_TIMEOUT_S": "30", "IRREV_POLICY_DIR": str(tmp_path)}
    validate = run_irrev("policy", "validate", str(tmp_path / "short.yaml"), **settings)
    assert validate.returncode == 1
    assert "hold_ttl: 20 s leaves no room to forward an effect: it must be at least 36 s" in (
        validate.stderr
    )
    assert run_irrev("policy", "validate", str(tmp_path / "short.yaml")).returncode == 0
    line = refused_start(**settings)
    assert "hold_ttl" in line and "36 s" in line, line


def test_reconcile_survives_a_removed_route(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    """Observation 12: a hold whose route left the policy stays ambiguous and is listed
    unresolved with a reason; the tenant's other holds are reconciled."""
    with own_gateway(redis_url, suppliers, tmp_path, 1) as gateway:
        tenant = gateway.tenant("own")
        written = (tmp_path / "policies" / f"{tenant.id}.yaml").read_text()
        with httpx.Client(base_url=gateway.url, timeout=30, trust_env=False) as http:
            upload(http, gateway, tenant, with_backup_tool(written, tenant))
            holds = {}
            for tool in ("backup", "supplier"):
                with httpx.Client(base_url=suppliers.url, trust_env=False) as upstream:
                    set_faults_sync(upstream, tenant, status=503, apply=True, times=1)
                response = http.post(
                    f"/tools/{tool}/orders",
                    json=order(),
                    headers=effect_headers(tenant, "buyer-01", tool),
                )
                assert_problem(response, 502, "upstream_ambiguous")
                holds[tool] = response.headers["x-irrev-hold"]
            upload(http, gateway, tenant, written)
            response = http.post(f"/v1/admin/tenants/{tenant.id}/reconcile", headers=gateway.admin)
            assert response.status_code == 200, response.text
            report = response.json()
            assert report["posted"] == [holds["supplier"]]
            assert "current policy" in report["unresolved"][holds["backup"]]
            ambiguous = http.get(
                f"/v1/admin/tenants/{tenant.id}/holds",
                params={"state": "ambiguous"},
                headers=gateway.admin,
            ).json()
            assert [h["hold"] for h in ambiguous] == [holds["backup"]]


def with_backup_tool(text: str, tenant: Tenant) -> str:
    """The policy with a second tool whose orders route reaches the same supplier."""
    data = yaml.safe_load(text)
    data["tools"]["backup"] = {"upstream": tenant.supplier}
    orders = next(r for r in data["routes"] if r["route"] == "POST /orders")
    data["routes"].append({**orders, "tool": "backup"})
    return yaml.safe_dump(data, sort_keys=False)


def upload(http: httpx.Client, gateway: Gateway, tenant: Tenant, text: str) -> None:
    url = f"/v1/admin/tenants/{tenant.id}/policy"
    shown = http.get(url, headers=gateway.admin)
    response = http.put(url, content=text, headers={**gateway.admin, **base_of(shown)})
    assert response.status_code == 200, response.text


def set_faults_sync(upstream: httpx.Client, tenant: Tenant, **faults: object) -> None:
    response = upstream.post(f"/{tenant.id}/_faults", json=faults)
    assert response.status_code == 200, response.text
