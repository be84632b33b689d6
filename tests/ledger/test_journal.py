"""The journal's entries: lean as stored (what follows from other fields is derived
on reading), each reserve with who asked for the effect and what it was."""

from __future__ import annotations

import hashlib

from ledger.audit import audit_tenant
from ledger.client import Ledger
from ledger.journal import Delta, JournalEntry, read_journal
from ledger.records import Provenance

from .conftest import open_accounts

HOUR_MS = 3_600_000
REQUEST = '{"method":"POST","path":"/v1/refunds","body_b64":"e30="}'


async def test_reserve_entries_record_who_asked_and_what_was_sent(
    ledger: Ledger, tenant: str
) -> None:
    """Issue 14: route, agent, principal, face value, the agent's key and a digest of
    the kept request, for a hold kept and for a refusal alike (a route id of an
    unknown route is the agent's path: any text survives)."""
    await open_accounts(ledger, tenant, tenant_acme=1000)
    asked = Provenance(
        route="pay POST /v1/a|b%7C",
        agent="agent-7",
        principal="ops",
        face_value=12_500_000,
        agent_key="key|%1",
    )
    for key, price in (("kept", 400), ("refused", 4000)):
        await ledger.reserve(
            tenant,
            key,
            "fp",
            {"tenant:acme": price},
            ttl_ms=HOUR_MS,
            request=REQUEST,
            provenance=asked,
        )
    kept, refused = (e for e in await read_journal(ledger, tenant) if e.op == "reserve")
    digest = hashlib.sha256(REQUEST.encode()).hexdigest()
    for entry in (kept, refused):
        assert entry.provenance == Provenance(
            route=asked.route,
            agent="agent-7",
            principal="ops",
            face_value=12_500_000,
            agent_key="key|%1",
            request_sha256=digest,
        )
        shown = entry.as_dict()
        assert (shown["route"], shown["agent_key"], shown["request_sha256"]) == (
            asked.route,
            "key|%1",
            digest,
        )
    assert (kept.state, refused.state) == ("pending", "denied")
    assert kept.deltas == (Delta("tenant:acme", 400, 0),) and refused.deltas == ()


async def test_lean_entries_replay_into_every_balance(ledger: Ledger, tenant: str) -> None:
    """Reserve and post entries keep no state or delta field: both are derived, and
    the audit's replay still proves every balance (a post releases the hold's
    amounts unless it had expired, and posts its own)."""
    await open_accounts(ledger, tenant, tenant_acme=10_000, agent_a=5_000)
    both = {"tenant:acme": 300, "agent:a": 200}
    await ledger.reserve(tenant, "k1", "fp", both, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "k1", {"tenant:acme": 250, "agent:a": 260})
    entries = await read_journal(ledger, tenant)
    reserve, post = entries[-2:]
    assert "st" not in reserve.fields and "d" not in post.fields
    assert (reserve.state, post.state) == ("pending", "posted")
    assert post.deltas == (Delta("tenant:acme", -300, 250), Delta("agent:a", -200, 260))
    assert post.fields["flag"] == "overrun"
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


async def test_one_amount_for_every_account_is_journaled_once(ledger: Ledger, tenant: str) -> None:
    """Issue 12: a reserve, and a post releasing and posting the same amount on every
    account (the common case), journal it once; the deltas are still per account."""
    await open_accounts(ledger, tenant, tenant_acme=10_000, agent_a=5_000)
    both = {"tenant:acme": 300, "agent:a": 300}
    await ledger.reserve(tenant, "k1", "fp", both, ttl_ms=HOUR_MS)
    await ledger.post(tenant, "k1", 120)
    reserve, post = (await read_journal(ledger, tenant))[-2:]
    assert (reserve.fields["amt"], post.fields["rel"], post.fields["pst"]) == ("300", "300", "120")
    # Within budget, the common reason, is the one an entry without `why` has.
    assert "why" not in reserve.fields and reserve.reason == "within_budget"
    assert (reserve.state, reserve.as_dict()["why"]) == ("pending", "within_budget")
    assert reserve.deltas == (Delta("tenant:acme", 300, 0), Delta("agent:a", 300, 0))
    assert post.deltas == (Delta("tenant:acme", -300, 120), Delta("agent:a", -300, 120))
    report = await audit_tenant(ledger, tenant)
    assert report.ok, report.mismatches


def test_entries_written_before_the_lean_forms_still_read() -> None:
    """Entries of an older irrev: one amount per account, the digest in hex."""
    digest = hashlib.sha256(REQUEST.encode()).hexdigest()
    reserve = JournalEntry(
        "1-0",
        "reserve",
        {
            "hold": "k1",
            "why": "within_budget",
            "acc": "tenant:acme,agent:a",
            "amt": "300,300",
            "prov": f"r|a|p|5|{digest}|key",
        },
    )
    post = JournalEntry(
        "2-0", "post", {"hold": "k1", "acc": "tenant:acme,agent:a", "pst": "9,9", "rel": "300,300"}
    )
    assert reserve.deltas == (Delta("tenant:acme", 300, 0), Delta("agent:a", 300, 0))
    assert post.deltas == (Delta("tenant:acme", -300, 9), Delta("agent:a", -300, 9))
    assert reserve.provenance == Provenance(
        route="r", agent="a", principal="p", face_value=5, agent_key="key", request_sha256=digest
    )


def test_the_digest_is_journaled_in_base64url() -> None:
    digest = hashlib.sha256(REQUEST.encode()).hexdigest()
    packed = Provenance(
        route="r", agent="a", principal="p", face_value=5, agent_key="key", request_sha256=digest
    ).packed()
    assert len(packed.split("|")[4]) == 43
    assert Provenance.unpacked(packed).request_sha256 == digest
