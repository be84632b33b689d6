"""`irrev demo-mcp --json` for real (its own embedded Redis, MCP server and `irrev serve
--workers 2`): the fleet's calls end admitted, escalated or refused with a reason
code, the server's effects are the posted holds, and the ledger audits."""

from __future__ import annotations

import json
import subprocess

from tests.gateway.servers import BIN, ROOT, base_env
from tests.test_docs import documented_reasons


def test_the_mcp_fleet_demo_names_each_outcome_and_its_effects_equal_the_posted_holds() -> None:
    done = subprocess.run(
        [str(BIN / "irrev"), "demo-mcp", "--json"],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and not result["audit_mismatches"], result
    assert result["server_effects"] == result["posted_holds"] > 0
    outcomes = result["outcomes"]
    # The fleet asks for more than its budget: some calls are refused, by reason code
    # (before, by the HTTP status 403 the refusal carries).
    assert outcomes["admitted"] > 0
    refusals = set(outcomes) - {"admitted", "escalated"}
    assert refusals and refusals <= documented_reasons(), outcomes
