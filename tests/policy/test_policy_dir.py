"""Loading a directory of tenant policies, authenticating tokens, demo token files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.state.policies import (
    PolicyLoadError,
    authenticate,
    check_demo_tokens,
    load_demo_tokens,
    load_policy_dir,
)
from pricing import PolicyError, hold_accounts, price_request

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_examples_dir_loads_every_tenant_and_skips_token_files() -> None:
    policies = load_policy_dir(EXAMPLES)
    assert sorted(policies) == ["acme", "globex", "mcp-fleet", "mcp-payco", "payco"]


def test_demo_tokens_authenticate_their_own_tenant_only() -> None:
    policies = load_policy_dir(EXAMPLES)
    acme = load_demo_tokens(EXAMPLES / "procurement.tokens.yaml")
    globex = load_demo_tokens(EXAMPLES / "globex.tokens.yaml")
    assert len(acme.tokens) == 52 and "buyer-50" in acme.tokens
    found = authenticate(policies, acme.tokens["buyer-07"])
    assert found is not None
    policy, agent = found
    assert (policy.tenant, agent.agent_id, agent.principal_id) == (
        "acme",
        "buyer-07",
        "procurement",
    )
    found = authenticate(policies, globex.tokens["picker-1"])
    assert found is not None and found[0].tenant == "globex"
    assert authenticate(policies, "irrev_not-a-token") is None
    # A globex agent's hold can only name globex accounts.
    effect = price_request(found[0], "inventory", "POST", "/adjust", {}, {"amount": 1})
    assert all(not a.endswith("acme") for a in hold_accounts(found[0], found[1], effect))


def test_check_demo_tokens_catches_a_wrong_token(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "globex.yaml", tmp_path / "globex.yaml")
    text = (EXAMPLES / "globex.tokens.yaml").read_text()
    demo = load_demo_tokens(EXAMPLES / "globex.tokens.yaml")
    broken = text.replace(demo.tokens["picker-2"], "irrev_" + "A" * 43)
    (tmp_path / "globex.tokens.yaml").write_text(broken)
    with pytest.raises(PolicyError, match=r"tokens\.picker-2: does not match"):
        check_demo_tokens(tmp_path / "globex.tokens.yaml")


def test_dir_with_a_bad_policy_and_a_duplicate_tenant_lists_both(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "globex.yaml", tmp_path / "a.yaml")
    shutil.copy(EXAMPLES / "globex.yaml", tmp_path / "b.yaml")
    shutil.copy(Path(__file__).parent / "malformed" / "unknown_class.yaml", tmp_path / "c.yml")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    text = str(info.value)
    assert "c.yml: routes[1].class" in text
    assert "b.yaml: tenant: 'globex' is also defined in" in text
    assert "agents.picker-1.token_sha256: the same token is already used" in text


def test_missing_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="not a directory"):
        load_policy_dir(tmp_path / "absent")


def test_a_settler_token_names_one_tenants_tool(tmp_path: Path) -> None:
    """A tool's settler token that is also an agent's (or another tool's) token in
    another tenant would settle as whichever the gateway looked up first."""
    globex = (EXAMPLES / "globex.yaml").read_text()
    agent_hash = globex.split('token_sha256: "', 1)[1].split('"', 1)[0]
    (tmp_path / "globex.yaml").write_text(globex)
    acme = (EXAMPLES / "procurement.yaml").read_text()
    settled = acme.replace("deploy: {}", f'deploy: {{settler_token_sha256: "{agent_hash}"}}')
    assert settled != acme
    (tmp_path / "acme.yaml").write_text(settled)
    with pytest.raises(PolicyLoadError, match="token_sha256: the same token is already used"):
        load_policy_dir(tmp_path)


def test_demo_tokens_of_settlers_and_admins_are_checked(tmp_path: Path) -> None:
    """The payments example's token file also holds its settler's and admin's tokens
    (the README walk-through settles with one): each must be the one its policy names."""
    demo = check_demo_tokens(EXAMPLES / "payments-api.tokens.yaml")
    assert set(demo.settlers) == {"payments"} and set(demo.admins) == {"ops-lead"}
    shutil.copy(EXAMPLES / "payments-api.yaml", tmp_path / "payments-api.yaml")
    text = (EXAMPLES / "payments-api.tokens.yaml").read_text()
    for wrong, where in (
        (demo.settlers["payments"], r"settlers\.payments"),
        (demo.admins["ops-lead"], r"admins\.ops-lead"),
    ):
        (tmp_path / "demo.tokens.yaml").write_text(text.replace(wrong, demo.tokens["support-01"]))
        with pytest.raises(PolicyError, match=rf"{where}: does not match"):
            check_demo_tokens(tmp_path / "demo.tokens.yaml")
    (tmp_path / "demo.tokens.yaml").write_text(text.replace("payments:", "nope:"))
    with pytest.raises(PolicyError, match=r"settlers\.nope: does not match"):
        check_demo_tokens(tmp_path / "demo.tokens.yaml")
