"""`irrev policy pull|push|diff|history` as a person runs them: processes, against
the shared gateway's admin API, with the admin token from the environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import Gateway, TenantMaker
from .servers import BIN, Tenant

# Each command is a Python process (~1 s of imports): .ci/run's slow pass.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy_cli_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("policy-cli")


def irrev(
    gateway: Gateway, *argv: str | Path, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IRREV_GATEWAY_URL": gateway.url}
    env["IRREV_ADMIN_TOKEN"] = gateway.admin_token if token is None else token
    return subprocess.run(
        [str(BIN / "irrev"), "policy", *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_pull_edit_push_diff_history(
    policy_cli_tenant: Tenant, gateway: Gateway, tmp_path: Path
) -> None:
    tenant = policy_cli_tenant.id
    mine, theirs = tmp_path / "mine.yaml", tmp_path / "theirs.yaml"
    for path in (mine, theirs):
        pulled = irrev(gateway, "pull", tenant, "-o", path)
        assert pulled.returncode == 0, pulled.stderr
    header = mine.read_text().partition("\n")[0]
    etag = header.split()[3]
    version = int(etag.partition("-")[0])
    assert header == f"# irrev: version {etag} of tenant {tenant}"
    assert irrev(gateway, "diff", mine).returncode == 0  # as stored

    def change(path: Path, field: str, value: str) -> None:
        head, _, body = path.read_text().partition("\n")
        document = yaml.safe_load(body)
        document["accounts"]["principals"][field]["limit"] = value
        path.write_text(head + "\n" + yaml.safe_dump(document, sort_keys=False))

    change(mine, "platform", "4321")
    differs = irrev(gateway, "diff", mine)
    assert differs.returncode == 1 and "4321" in differs.stdout
    pushed = irrev(gateway, "push", mine)
    assert pushed.returncode == 0, pushed.stderr
    assert f"version {version + 1} (made from {etag})" in pushed.stdout
    # Another person's copy, from the same version: another field merges ...
    change(theirs, "facilities", "765")
    assert irrev(gateway, "push", theirs).returncode == 0
    # ... the same field, changed since, is refused with its name; nothing is applied.
    change(theirs, "platform", "1")
    refused = irrev(gateway, "push", theirs)
    assert refused.returncode == 1
    assert "policy_conflict" in refused.stderr and "platform" in refused.stderr
    history = irrev(gateway, "history", tenant, "--limit", "3")
    assert [int(line.split()[0]) for line in history.stdout.splitlines()] == [
        version + 2,
        version + 1,
        version,
    ]
    latest = irrev(gateway, "history", tenant, "--limit", "1", "--json")
    assert [entry["version"] for entry in json.loads(latest.stdout)] == [version + 2]


def test_bad_calls_say_what_to_do(
    policy_cli_tenant: Tenant, gateway: Gateway, tmp_path: Path
) -> None:
    tenant = policy_cli_tenant.id
    unheaded = tmp_path / "unheaded.yaml"
    unheaded.write_text(f"tenant: {tenant}\n")
    # Pulled before a pull's header named the version's digest: pull it again.
    numbered = tmp_path / "numbered.yaml"
    numbered.write_text(f"# irrev: version 1 of tenant {tenant}\ntenant: {tenant}\n")
    for argv, token, said in (
        (("push", unheaded), None, "--base"),
        (("push", numbered), None, "if_match_without_digest"),
        (("push", tmp_path / "missing.yaml"), None, "cannot read"),
        (("pull", tenant), "", "IRREV_ADMIN_TOKEN"),
        (("pull", tenant), "wrong", "unauthenticated"),
        (("history", tenant, "--limit", "0"), None, "between 1 and 50"),
    ):
        done = irrev(gateway, *argv, token=token)
        assert done.returncode in (1, 2), (argv, done.stdout)
        # One line says it (argparse's usage, above it, aside).
        assert said in done.stderr.strip().splitlines()[-1], done.stderr
