"""`irrev demo --shadow` as a user runs it: the demo fleet's seeded orders, one by one,
through a real gateway, embedded Redis and supplier API, enforced and then in shadow
mode. What shadow mode would have decided is what enforcement decided, order by order
(the command keeps both ledgers equal before every order: see its docstring)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .servers import ROOT, base_env

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

DEMO = [sys.executable, "-m", "irrev.cli", "demo"]


def test_shadow_would_decide_what_enforcement_decides_on_the_same_seed() -> None:
    result = subprocess.run(
        [*DEMO, "--shadow", "--json", "--agents", "20", "--ticks", "20", "--seed", "7"],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    pairs = report["orders_decided"]
    assert report["ok"] and report["same"] == report["orders"] == len(pairs) > 0
    for pair in pairs:
        enforced, shadowed = pair["enforce"], pair["shadow"]
        assert (enforced["key"], enforced["decision"], enforced["reason"]) == (
            shadowed["key"],
            shadowed["decision"],
            shadowed["reason"],
        )
    decisions = report["enforce"]["decisions"]
    # A workload that exercises every kind of decision, not only admissions.
    assert decisions.get("deny: budget_exceeded", 0) > 0
    assert decisions.get("deny: per_effect_cap", 0) > 0
    assert decisions.get("escalate: soft_band", 0) > 0
    # Enforcement made only what it admitted or approved; shadow mode made everything.
    made = sum(n for k, n in decisions.items() if not k.startswith("deny"))
    assert report["enforce"]["supplier_orders"] == made
    assert report["shadow"]["supplier_orders"] == len(pairs)
    assert report["enforce"]["tenant_used"] == report["shadow"]["tenant_used"]
    assert report["shadow"]["compensated"] > 0
