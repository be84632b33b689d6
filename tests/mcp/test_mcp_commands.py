"""`irrev demo-mcp --json` and `irrev bench mcp --json` for real (each with its own
embedded Redis, MCP server and `irrev serve --workers 2`). The demo: the fleet's
calls end admitted, escalated or refused with a reason code, the server's effects
are the posted holds, and the ledger audits. The bench: direct, the peer proxy and
irrev measured in one run, every call through irrev admitted (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.gateway.servers import BIN, ROOT, base_env
from tests.test_docs import documented_reasons

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow


def irrev(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "irrev"), *argv],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_mcp_fleet_demo_names_each_outcome_and_its_effects_equal_the_posted_holds() -> None:
    done = irrev("demo-mcp", "--json")
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


def test_the_mcp_bench_compares_calls_through_irrev_with_direct_ones() -> None:
    done = irrev(
        "bench", "mcp", "--seconds", "1", "--sessions", "2", "--appendfsync", "everysec", "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["appendfsync"] == "everysec"
    runs = {run["run"]: run for run in result["runs"]}
    assert set(runs) == {
        f"{side}, {n}" for side in ("direct", "peer", "irrev") for n in ("1 session", "2 sessions")
    }
    # Every call through irrev was admitted and made: a refusal would count as an error.
    for run in runs.values():
        assert run["calls_per_s"] > 0 and run["errors"] == 0, run
        # Every call costs the MCP server and the agents; a proxy only where there is one.
        assert run["tool_cpu_ms_per_call"] > 0 and run["agents_cpu_ms_per_call"] > 0, run
        proxied = not run["run"].startswith("direct")
        assert (run["proxy_cpu_ms_per_call"] > 0) == proxied, run
    ratio = runs["irrev, 2 sessions"]["calls_per_s"] / runs["direct, 2 sessions"]["calls_per_s"]
    assert result["throughput_ratio"] == ratio
    peer = runs["irrev, 2 sessions"]["calls_per_s"] / runs["peer, 2 sessions"]["calls_per_s"]
    assert result["peer_throughput_ratio"] == peer
    assert {"added_p50_ms", "added_p99_ms", "peer_added_p50_ms", "added_p50_vs_peer"} <= set(result)
