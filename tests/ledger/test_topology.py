"""failover_shortfall: which primaries cannot acknowledge IRREV_WAIT_REPLICAS=N after
one failure (a replica's death, or a failover that promotes one), and what to change.
The reads it judges, on real servers: tests/gateway/test_topology.py."""

from __future__ import annotations

from ledger import failover_shortfall


def test_no_wait_needs_no_replica() -> None:
    assert failover_shortfall({"a:1": 0}, 0) == ""


def test_n_plus_one_replicas_survive_one_failure() -> None:
    assert failover_shortfall({"a:1": 2, "b:2": 3}, 1) == ""
    assert failover_shortfall({"a:1": 3}, 2) == ""


def test_n_replicas_are_short_after_one_failure() -> None:
    said = failover_shortfall({"a:1": 2, "b:2": 1, "c:3": 1}, 1)
    assert "IRREV_WAIT_REPLICAS=1 needs 2 replicas per primary" in said
    assert "b:2 has 1, c:3 has 1" in said and "a:1" not in said
    assert "short already" not in said
    assert "give each primary 2 replicas, or lower IRREV_WAIT_REPLICAS" in said


def test_fewer_than_n_replicas_are_short_already() -> None:
    said = failover_shortfall({"a:1": 1}, 2)
    assert "a:1 has 1 (short already)" in said
    assert "needs 3 replicas per primary" in said
