"""The server's persistence as the ledger reads it at start, and what counts as able
to lose an acknowledged write."""

from __future__ import annotations

from ledger import Durability, Ledger


async def test_the_servers_settings_are_read(ledger: Ledger) -> None:
    found = await ledger.durability()
    assert set(found.appendonly.split("|")) <= {"yes", "no"}
    assert set(found.appendfsync.split("|")) <= {"always", "everysec", "no"}
    assert found.min_replicas_to_write.replace("|", "").isdigit()


def test_what_can_lose_a_write() -> None:
    assert Durability("yes", "always", "0").shortfall(0) == ""
    assert Durability("yes", "everysec", "0").shortfall(0) == ""
    assert "appendfsync is no" in Durability("yes", "no", "0").shortfall(0)
    assert "appendonly is no" in Durability("no", "always", "0").shortfall(0)
    assert "could not be read" in Durability("unknown", "unknown", "unknown").shortfall(0)
    # Replicas that must acknowledge each write keep it through a failover.
    assert Durability("no", "no", "0").shortfall(1) == ""
