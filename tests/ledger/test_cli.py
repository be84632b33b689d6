"""`irrev ledger ...` as an operator runs it, in a subprocess against a real Redis: it
names the Redis it reads, refuses a tenant the ledger does not know, prints amounts
with the tenant's currency, `--json` everywhere, and full names when piped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from irrev.commands.ledger import safe_url
from irrev.harness import PolicyDraft
from ledger.client import Ledger
from ledger.records import AccountSpec, Provenance

from .test_audit import busy_tenant

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LONG = "factor:supplier:" + "a-supplier-whose-name-is-longer-than-one-terminal-column-" + "x" * 40


def irrev_ledger(redis_url: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "IRREV_REDIS_URL": redis_url, **env}
    environment.pop("IRREV_POLICY_DIR", None)
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "irrev.cli", "ledger", *argv],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["balance", "--tenant", "nobody-here"],
        ["journal", "--tenant", "nobody-here"],
        ["reconcile", "--tenant", "nobody-here"],
        ["sweep", "--tenant", "nobody-here"],
        ["audit", "--tenant", "nobody-here"],
    ],
)
def test_an_unknown_tenant_is_refused_in_one_line(redis_url: str, argv: list[str]) -> None:
    result = irrev_ledger(redis_url, *argv)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("irrev: ledger at ")
    assert lines[-1].startswith("irrev: no tenant 'nobody-here' in the ledger at ")
    assert len(lines) == 2 and "Traceback" not in result.stderr


async def test_balance_names_its_redis_shows_currency_and_full_names(
    ledger: Ledger, tenant: str, redis_url: str, tmp_path: Path
) -> None:
    await busy_tenant(ledger, tenant)
    await ledger.upsert_account(
        tenant, AccountSpec(account=LONG, limit=2_500_000, soft_limit=2_500_000)
    )
    # Piped, with no policy: integer minor units, said so, and every name whole.
    plain = irrev_ledger(redis_url, "balance", "--tenant", tenant)
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr.splitlines()[0] == f"irrev: ledger at {safe_url(redis_url)}"
    assert "(minor units)" in plain.stdout and LONG in plain.stdout
    # With the tenant's policy (micro-USD): amounts with their currency.
    PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant).write(tmp_path)
    shown = irrev_ledger(redis_url, "balance", "--tenant", tenant, "--policy-dir", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "2.5 USD" in shown.stdout and "(USD)" in shown.stdout
    as_json = irrev_ledger(
        redis_url, "balance", "--tenant", tenant, "--json", IRREV_POLICY_DIR=str(tmp_path)
    )
    rows = {r["account"]: r for r in json.loads(as_json.stdout)["balances"]}
    row = rows[LONG]
    assert (row["limit"], row["limit_text"], row["currency"]) == (2_500_000, "2.5 USD", "USD")
    assert row["available"] == row["limit"] - row["pending"] - row["posted"]
    assert row["window_start_at"].endswith("Z")


async def test_every_command_prints_json(ledger: Ledger, tenant: str, redis_url: str) -> None:
    await busy_tenant(ledger, tenant)
    audit = irrev_ledger(redis_url, "audit", "--tenant", tenant, "--json")
    assert audit.returncode == 0, audit.stderr
    assert json.loads(audit.stdout)["tenants"][0]["live_holds"] == 17
    ambiguous = json.loads(
        irrev_ledger(redis_url, "reconcile", "--tenant", tenant, "--json").stdout
    )
    (hold,) = ambiguous["ambiguous"]
    assert (hold["hold"], hold["ambiguity"], hold["amounts"]["agent:a"]) == (
        "k3",
        "upstream_timeout",
        103,
    )
    assert hold["created_at"].endswith("Z")
    swept = json.loads(irrev_ledger(redis_url, "sweep", "--tenant", tenant, "--json").stdout)
    assert swept == {"tenant": tenant, "settled": 0}
    journal = irrev_ledger(redis_url, "journal", "--tenant", tenant, "--json", "--count", "3")
    entries = [json.loads(line) for line in journal.stdout.splitlines()]
    assert len(entries) == 3 and all(e["at"].endswith("Z") for e in entries)


async def test_archive_takes_settled_holds_out_of_the_slot(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await busy_tenant(ledger, tenant)
    before = {h: await ledger.hold(tenant, h) for h in ("k0", "k1", "k2")}
    done = irrev_ledger(redis_url, "archive", "--tenant", tenant, "--older-than-s", "0", "--json")
    assert done.returncode == 0, done.stderr
    archived = json.loads(done.stdout)["archived"]
    assert archived > 0
    assert await ledger.redis.hlen(f"irrev:{{{tenant}}}:settled") == archived
    assert {h: await ledger.hold(tenant, h) for h in before} == before
    audit = irrev_ledger(redis_url, "audit", "--tenant", tenant)
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_the_journal_prints_control_characters_escaped(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    """An agent's key (or an older gateway's unknown path) is kept verbatim in the
    journal: printed raw, a carriage return and an erase-line sequence overwrote the
    entry on a terminal with a forged one (`... approve ... by=operator:ops`)."""
    await ledger.upsert_account(tenant, AccountSpec(account="agent:a", limit=1000, soft_limit=1000))
    forged = "k\r\x1b[2K1796150000000-0  approve    hold=deadbeef by=operator:ops"
    provenance = Provenance(
        route="route", agent="a", principal="ops", face_value=5, agent_key=forged
    )
    await ledger.reserve(tenant, "h1", "fp", {"agent:a": 5}, ttl_ms=60_000, provenance=provenance)
    journal = irrev_ledger(redis_url, "journal", "--tenant", tenant)
    assert journal.returncode == 0, journal.stderr
    assert "\x1b" not in journal.stdout and "\r" not in journal.stdout
    assert "k\\r\\x1b[2K1796150000000-0" in journal.stdout


async def test_the_journal_shows_amounts_in_the_tenants_currency(
    ledger: Ledger, tenant: str, redis_url: str, tmp_path: Path
) -> None:
    """With the tenant's policy (micro-USD), each entry's balance changes carry their
    currency beside the stored integers; without one, the integers alone, said so."""
    await busy_tenant(ledger, tenant)
    PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant).write(tmp_path)
    policy = {"IRREV_POLICY_DIR": str(tmp_path)}
    lines = irrev_ledger(redis_url, "journal", "--tenant", tenant, "--json", **policy).stdout
    entries = {e["hold"]: e for e in map(json.loads, lines.splitlines()) if e["op"] == "post"}
    changes = {c["account"]: c for c in entries["k1"]["changes"]}
    assert entries["k1"]["currency"] == "USD"
    assert changes["agent:a"] == {
        "account": "agent:a",
        "pending": -101,
        "pending_text": "-0.000101 USD",
        "posted": 500,
        "posted_text": "0.0005 USD",
    }
    text = irrev_ledger(redis_url, "journal", "--tenant", tenant, **policy).stdout
    [posted] = [line for line in text.splitlines() if " post " in line and "hold=k1 " in line]
    assert "agent:a pending -0.000101 USD posted +0.0005 USD" in posted
    bare = irrev_ledger(redis_url, "journal", "--tenant", tenant, "--json").stdout
    assert all("currency" not in json.loads(line) for line in bare.splitlines())


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@10.0.0.1:6379/0", "redis://:***@10.0.0.1:6379/0"),
        ("rediss://ops:s3cret@host/1", "rediss://ops:***@host/1"),
        ("unix:///run/redis.sock?db=0&password=s3cret", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
    ],
)
def test_the_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert safe_url(url) == shown
