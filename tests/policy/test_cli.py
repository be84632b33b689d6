"""`irrev policy validate|show|token` through the installed console script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pricing import hash_token

ROOT = Path(__file__).resolve().parents[2]
IRREV = Path(sys.executable).with_name("irrev")
MALFORMED = Path(__file__).parent / "malformed"


def irrev(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(IRREV), *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_examples_validate() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    result = irrev("policy", "validate", *examples)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "procurement.yaml: ok (tenant acme: 4 principals, 52 agents" in result.stdout
    assert "procurement.tokens.yaml: ok (demo tokens for 52 agents of acme)" in result.stdout


@pytest.mark.parametrize(
    ("fixture", "messages"),
    [
        pytest.param(
            "face_value_missing_field.yaml",
            ["routes[2].face_value: field 'unit_price' is not declared"],
            id="face-value-field",
        ),
        pytest.param(
            "duplicate_route.yaml",
            ["routes[3].route: duplicate route: shop POST /orders"],
            id="duplicate-route",
        ),
        pytest.param(
            "unknown_class.yaml",
            ["routes[1].class: ", "(got 'refundable')"],
            id="unknown-class",
        ),
        pytest.param(
            "unknown_principal.yaml",
            ["agents.a2.principal: principal 'sales'", "agents.a1.per_effect_cap: "],
            id="two-problems",
        ),
        pytest.param("not_yaml.yaml", ["not valid YAML at line 3"], id="not-yaml"),
    ],
)
def test_malformed_policy_exits_1_naming_fields(fixture: str, messages: list[str]) -> None:
    result = irrev("policy", "validate", MALFORMED / fixture)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    for message in messages:
        assert any(line.startswith(str(MALFORMED / fixture)) and message in line for line in lines)


def test_one_bad_file_among_good_ones_fails_the_run() -> None:
    result = irrev("policy", "validate", "examples/globex.yaml", MALFORMED / "duplicate_route.yaml")
    assert result.returncode == 1
    assert "globex.yaml: ok" in result.stdout
    assert "duplicate route" in result.stderr


def test_same_tenant_in_two_files_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "globex-copy.yaml"
    copy.write_text((ROOT / "examples" / "globex.yaml").read_text())
    result = irrev("policy", "validate", "examples/globex.yaml", copy)
    assert result.returncode == 1
    assert f"{copy}: tenant: 'globex' is also defined in examples/globex.yaml" in result.stderr


def test_same_file_twice_is_validated_once() -> None:
    result = irrev("policy", "validate", "examples/globex.yaml", "./examples/globex.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok (tenant globex") == 1


def test_missing_file_is_a_usage_error() -> None:
    result = irrev("policy", "validate", "examples/nope.yaml")
    assert result.returncode == 2
    assert "examples/nope.yaml: no such file" in result.stderr


def test_show_summarises_accounts_agents_and_routes() -> None:
    result = irrev("policy", "show", "examples/procurement.yaml")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tenant acme: risk unit USD" in out and "window 24h" in out
    assert re.search(r"tenant:acme\s+limit\s+250,000 USD", out)
    assert re.search(r"factor:supplier:\* \(each\)\s+limit\s+100,000 USD", out)
    assert "agents (52):" in out and "buyer-50" in out
    assert re.search(r"supplier POST /orders\s+compensable\s+quantile\s+x0\.7625", out)
    assert "10,000 USD face costs 7,625.21567 USD" in out
    assert re.search(r"supplier GET /orders/\{order_id\}\s+read\s+free", out)


def test_show_of_a_malformed_policy_exits_1() -> None:
    result = irrev("policy", "show", MALFORMED / "duplicate_route.yaml")
    assert result.returncode == 1
    assert "duplicate route" in result.stderr


def test_token_prints_a_fresh_token_and_its_hash_line() -> None:
    first = irrev("policy", "token", "--tenant", "acme", "--agent", "buyer-51")
    second = irrev("policy", "token", "--tenant", "acme", "--agent", "buyer-51")
    assert first.returncode == 0, first.stderr
    token = re.search(r"^\s+(irrev_[A-Za-z0-9_-]{43})$", first.stdout, re.M)
    line = re.search(r'token_sha256: "(sha256:[0-9a-f]{64})"', first.stdout)
    assert token and line
    assert line.group(1) == hash_token(token.group(1))
    assert "agents.buyer-51" in first.stdout
    assert token.group(1) not in second.stdout


def test_token_for_a_tools_settler() -> None:
    issued = irrev("policy", "token", "--tenant", "acme", "--tool", "supplier")
    assert issued.returncode == 0, issued.stderr
    token = re.search(r"^\s+(irrev_[A-Za-z0-9_-]{43})$", issued.stdout, re.M)
    line = re.search(r'settler_token_sha256: "(sha256:[0-9a-f]{64})"', issued.stdout)
    assert token and line and line.group(1) == hash_token(token.group(1))
    assert "tools.supplier" in issued.stdout
    both = irrev("policy", "token", "--tenant", "acme", "--tool", "x", "--agent", "y")
    assert both.returncode != 0


def test_token_for_a_tenant_admin() -> None:
    """The README says `irrev policy token` makes a tenant admin's token too."""
    issued = irrev("policy", "token", "--tenant", "acme", "--admin", "alice")
    assert issued.returncode == 0, issued.stderr
    token = re.search(r"^\s+(irrev_[A-Za-z0-9_-]{43})$", issued.stdout, re.M)
    line = re.search(r'^\s+token_sha256: "(sha256:[0-9a-f]{64})"', issued.stdout, re.M)
    assert token and line and line.group(1) == hash_token(token.group(1))
    assert "admins.alice" in issued.stdout
    bad = irrev("policy", "token", "--tenant", "acme", "--admin", "operator:x")
    assert bad.returncode == 2 and "not a name a policy accepts" in bad.stderr


def test_validate_show_and_token_print_json() -> None:
    """`--json` for programs: integer minor units beside amounts with their currency."""
    examples = [ROOT / "examples" / "procurement.yaml", MALFORMED / "duplicate_route.yaml"]
    checked = irrev("policy", "validate", "--json", *examples)
    assert checked.returncode == 1
    report = json.loads(checked.stdout)
    assert not report["ok"] and report["valid"][0]["tenant"] == "acme"
    assert report["problems"][0]["path"] == "routes[3].route"
    shown = irrev("policy", "show", "--json", ROOT / "examples" / "procurement.yaml")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert (summary["tenant"], summary["currency"], summary["mode"]) == ("acme", "USD", "enforce")
    tenant = next(a for a in summary["accounts"] if a["account"] == "tenant:acme")
    assert (tenant["limit"], tenant["limit_text"]) == (250_000 * 10**6, "250,000 USD")
    issued = json.loads(
        irrev("policy", "token", "--tenant", "acme", "--agent", "a1", "--json").stdout
    )
    assert issued["hash"] == hash_token(issued["token"])
