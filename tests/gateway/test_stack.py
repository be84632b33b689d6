"""irrev/stack.py's gateway, as `irrev demo`, `irrev load` and the benches start it:
its operator decides under a person's name, as a real operator's token names one."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import httpx

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
