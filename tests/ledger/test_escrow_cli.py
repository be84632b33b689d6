"""`irrev ledger escrow split|show|recover` as an operator runs it, in a subprocess
against a real Redis (a cluster's primaries too, with IRREV_TEST_SERVERS=cluster):
a split names its shards and where they are, `show` adds each account up and exits
1 when it does not add up, `recover` finishes what a dead process left in flight
and exits 1 for what is stranded, and a wrong call says so in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from irrev.harness import PolicyDraft
from ledger.client import Ledger
from ledger.escrow import Escrow, _write
from ledger.keys import accounts_key, escrow_key
from ledger.records import AccountSpec

from .test_cli import EXAMPLES, irrev_ledger

DAY_MS = 24 * 3_600_000


def escrow(redis_url: str, *argv: str) -> tuple[int, dict[str, Any]]:
    result = irrev_ledger(redis_url, "escrow", *argv, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


async def test_split_show_and_recover_a_transfer_a_dead_process_left(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    code, split = escrow(redis_url, "split", "--tenant", tenant, "--shards", "3")
    assert code == 0 and split["tenant"] == tenant
    shards = split["shards"]
    opened = await Escrow.of(ledger, tenant)
    assert [s["shard"] for s in shards] == opened.shards
    primaries = [s["primary"] for s in shards]
    # On a cluster each shard is on a primary of its own; a standalone server names none.
    assert primaries == [None] * 3 or len(set(primaries)) == 3
    await opened.define(AccountSpec(account="tenant:acme", limit=1000, soft_limit=1000))
    await opened.refill(1, "tenant:acme", 40)
    # A refill's first step (debited from the parent), by a process that died before
    # the second: in flight, still counted, held by no shard yet.
    granted = await _write(
        ledger, "escrow", tenant, ["grant", "g-1", "0", "tenant:acme", "100", "1"]
    )
    assert granted[0] == "ok"
    code, shown = escrow(redis_url, "show", "--tenant", tenant)
    assert code == 0 and shown["ok"] is True and shown["in_flight"] == 1
    (account,) = shown["accounts"]
    slice_1 = account["slices"][opened.shards[1]]
    assert account["account"] == "tenant:acme" and account["limit"] == 1000
    assert account["unleased"] == 1000 - 100 - slice_1 and slice_1 >= 40
    assert account["slices"][opened.shards[0]] == 0

    code, recovered = escrow(redis_url, "recover", "--tenant", tenant)
    assert code == 0
    assert (recovered["grants"], recovered["stranded"]) == (1, [])
    code, shown = escrow(redis_url, "show", "--tenant", tenant)
    (account,) = shown["accounts"]
    assert code == 0 and shown["in_flight"] == 0
    assert account["slices"][opened.shards[0]] == 100

    text = irrev_ledger(redis_url, "escrow", "show", "--tenant", tenant)
    assert text.returncode == 0, text.stderr
    assert "tenant:acme" in text.stdout and "0 transfers in flight: ok" in text.stdout


async def test_show_and_recover_exit_1_for_budget_that_does_not_add_up_or_is_stranded(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    opened = await Escrow.split(ledger, tenant, 2)
    await opened.define(AccountSpec(account="tenant:acme", limit=100, soft_limit=100))
    await opened.refill(1, "tenant:acme", 10)
    # A slice raised outside a transfer: budget from nowhere.
    await ledger.redis.hincrby(accounts_key(opened.shards[1]), "tenant:acme|limit", 5)
    shown = irrev_ledger(redis_url, "escrow", "show", "--tenant", tenant)
    assert shown.returncode == 1
    assert "1 MISMATCHES" in shown.stdout and "105" in shown.stdout
    await ledger.redis.hincrby(accounts_key(opened.shards[1]), "tenant:acme|limit", -5)
    # A grant taken 8 days ago and never applied: past the retention, held nowhere.
    long_ago = await ledger.now_ms() - 8 * DAY_MS
    await ledger.redis.hset(escrow_key(tenant), "g|g-old", f"0|tenant:acme|7|{long_ago}")
    await ledger.redis.hincrby(escrow_key(tenant), "u|tenant:acme", -7)
    recover = irrev_ledger(redis_url, "escrow", "recover", "--tenant", tenant)
    assert recover.returncode == 1
    assert "1 stranded" in recover.stdout and "grant g-old: 7 of tenant:acme" in recover.stdout


async def test_show_gives_amounts_in_the_tenants_currency_with_its_policy(
    ledger: Ledger, tenant: str, redis_url: str, tmp_path: Path
) -> None:
    opened = await Escrow.split(ledger, tenant, 2)
    await opened.define(AccountSpec(account="tenant:acme", limit=2_500_000, soft_limit=2_500_000))
    await opened.refill(0, "tenant:acme", 500_000)
    slice_0 = (await opened.accounts())[0].slices[0]
    # The tenant's policy is in micro-USD: each amount gets its text beside it.
    PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant).write(tmp_path)
    code, shown = escrow(redis_url, "show", "--tenant", tenant, "--policy-dir", str(tmp_path))
    (account,) = shown["accounts"]
    assert code == 0 and account["currency"] == "USD"
    assert (account["limit"], account["limit_text"]) == (2_500_000, "2.5 USD")
    first, second = opened.shards
    assert account["slices"][first] == slice_0 >= 500_000
    assert account["slices_text"][first] == f"{slice_0 / 1e6:.6f}".rstrip("0").rstrip(".") + " USD"
    assert account["used_text"] == {first: "0 USD", second: "0 USD"}
    assert account["unleased"] == 2_500_000 - slice_0
    # Without a policy for the tenant: the stored integers alone.
    code, bare = escrow(redis_url, "show", "--tenant", tenant, "--policy-dir", str(tmp_path / "x"))
    assert code == 0 and "currency" not in bare["accounts"][0]


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The last line of what the command said on stderr (the first names the Redis)."""
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


async def test_a_wrong_call_says_what_is_wrong_in_one_line(
    ledger: Ledger, tenant: str, redis_url: str
) -> None:
    await ledger.upsert_account(
        tenant, AccountSpec(account="tenant:plain", limit=10, soft_limit=10)
    )
    plain = irrev_ledger(redis_url, "escrow", "split", "--tenant", tenant, "--shards", "2")
    assert plain.returncode == 2 and "has accounts of its own" in one_line(plain)
    not_split = irrev_ledger(redis_url, "escrow", "show", "--tenant", tenant)
    assert not_split.returncode == 2 and "is not split into escrow shards" in one_line(not_split)
    unknown = irrev_ledger(redis_url, "escrow", "recover", "--tenant", f"{tenant}-nobody")
    assert unknown.returncode == 1 and "no tenant" in one_line(unknown)
    too_many = irrev_ledger(
        redis_url, "escrow", "split", "--tenant", f"{tenant}-x", "--shards", "65"
    )
    assert too_many.returncode == 2 and "--shards" in one_line(too_many)
    await Escrow.split(ledger, f"{tenant}-s", 2)
    again = irrev_ledger(redis_url, "escrow", "split", "--tenant", f"{tenant}-s", "--shards", "3")
    assert again.returncode == 2 and "is split already" in one_line(again)
    assert len((await Escrow.of(ledger, f"{tenant}-s")).shards) == 2
