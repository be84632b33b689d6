"""The fleet's policy store: a write lands only over the version its writer read, so
an old host's copy never overwrites a newer policy; every write bumps the epoch."""

from __future__ import annotations

from ledger import Ledger


async def test_a_write_over_an_old_version_loses(ledger: Ledger, tenant: str) -> None:
    store = ledger.policies
    epoch = await store.epoch()
    first = await store.put(tenant, expected=0, digest="a", text="A", stamp_ms=5, origin="h1")
    assert (first.won, first.version, first.stamp_ms) == (True, 1, 5)
    newer = await store.put(tenant, expected=1, digest="b", text="B", stamp_ms=None, origin="h2")
    assert newer.won and newer.version == 2 and newer.stamp_ms > 5  # Redis time
    stale = await store.put(tenant, expected=1, digest="a", text="A", stamp_ms=9, origin="h1")
    assert (stale.won, stale.version) == (False, 2)
    record = (await store.records([tenant]))[tenant]
    assert (record.version, record.digest, record.text, record.origin) == (2, "b", "B", "h2")
    assert await store.epoch() >= epoch + 2


async def test_the_same_text_again_is_no_new_version(ledger: Ledger, tenant: str) -> None:
    store = ledger.policies
    await store.put(tenant, expected=0, digest="a", text="A", stamp_ms=1, origin="h1")
    again = await store.put(tenant, expected=1, digest="a", text="A", stamp_ms=2, origin="h2")
    assert (again.won, again.version, again.stamp_ms) == (True, 1, 1)
    assert await store.records([tenant + "-none"]) == {}
