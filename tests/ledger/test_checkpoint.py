"""Trimming the journal keeps the whole history (archive + stream) and the audit
still checks every balance from the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.audit import audit_tenant
from ledger.checkpoint import CheckpointMoved, _swap, load_checkpoint, trim
from ledger.client import Ledger
from ledger.journal import JournalEntry, read_journal

from .conftest import open_accounts
from .helpers import tamper_account
from .test_audit import busy_tenant

FAR_FUTURE_MS = 2**52


async def test_trim_archives_then_audit_still_checks(
    ledger: Ledger, tenant: str, tmp_path: Path
) -> None:
    await busy_tenant(ledger, tenant)
    before = await read_journal(ledger, tenant, count=10_000)
    trimmed = await trim(ledger, tenant, tmp_path, FAR_FUTURE_MS)
    assert trimmed == len(before) == 27
    lines = (tmp_path / f"{tenant}.journal.jsonl").read_text().splitlines()
    archived = [json.loads(line) for line in lines]
    assert [a["id"] for a in archived] == [e.entry_id for e in before]
    assert await read_journal(ledger, tenant) == []

    # Life goes on after the trim, and the audit sees checkpoint + new entries.
    await ledger.post(tenant, "k4", 104)
    await ledger.void(tenant, "k5")
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches
    assert (report.entries, report.live_holds) == (29, 15)

    # And it still catches a balance that does not add up.
    await tamper_account(ledger, tenant, "agent:a", "pend", 1)
    mismatches = (await audit_tenant(ledger, tenant)).mismatches
    assert len(mismatches) == 1 and "agent:a" in mismatches[0]


def entry_ms(entry: JournalEntry) -> int:
    return int(entry.entry_id.split("-")[0])


async def test_trim_keeps_recent_entries(ledger: Ledger, tenant: str, tmp_path: Path) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    # Reserve until an entry from the third on starts a later millisecond than the one
    # before it: the cut needs an entry in an earlier millisecond, to trim. A fast
    # server writes the account and the first reserves in one millisecond, and a cut
    # at an entry of that millisecond trims nothing (this failed with an IndexError).
    entries: list[JournalEntry] = []
    starts: list[int] = []
    reserves = 0
    while reserves < 4 or not starts:
        await ledger.reserve(tenant, f"k{reserves}", "fp", {"tenant:acme": 10}, ttl_ms=60_000)
        reserves += 1
        entries = await read_journal(ledger, tenant)
        starts = [
            i for i in range(2, len(entries)) if entry_ms(entries[i]) > entry_ms(entries[i - 1])
        ]
    # Cut at that entry's millisecond: it and everything after are kept, the entries
    # of earlier milliseconds are trimmed, and the checkpoint ends at the one before it.
    cut = starts[0]
    cut_ms = entry_ms(entries[cut])
    kept_before = [e for e in entries if entry_ms(e) >= cut_ms]
    await trim(ledger, tenant, tmp_path, cut_ms)
    assert await read_journal(ledger, tenant) == kept_before
    assert (await load_checkpoint(ledger, tenant)).upto == entries[cut - 1].entry_id
    assert (await audit_tenant(ledger, tenant)).ok


async def test_concurrent_trim_loses_nothing(ledger: Ledger, tenant: str, tmp_path: Path) -> None:
    await open_accounts(ledger, tenant, tenant_acme=1000)
    await trim(ledger, tenant, tmp_path, FAR_FUTURE_MS)
    with pytest.raises(CheckpointMoved):
        await _swap(ledger, tenant, "-", "1-0", "{}")
    assert (await audit_tenant(ledger, tenant)).ok
