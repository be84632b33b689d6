"""Whether the ledger's Redis can still acknowledge IRREV_WAIT_REPLICAS after one
failure: a rule over the replicas each primary has (durability.read_replicas reads
them). Pure: no Redis here."""

from __future__ import annotations

from collections.abc import Mapping


def failover_shortfall(replicas: Mapping[str, int], wait_replicas: int) -> str:
    """Why one failure would stop admissions ("" if none would), and what to change.

    Every admission waits for `wait_replicas` replicas (IRREV_WAIT_REPLICAS) of the
    primary that ran it. A primary with r replicas has r - 1 left when one of them
    dies, and its new primary has r - 1 when a failover promotes one: fewer than
    `wait_replicas`, and every admission there fails closed (503 not_replicated)
    until a replica is back. So each primary (`replicas`: its address -> how many
    replicas it has now) needs `wait_replicas` + 1."""
    if wait_replicas <= 0:
        return ""
    needed = wait_replicas + 1
    short = sorted((address, count) for address, count in replicas.items() if count < needed)
    if not short:
        return ""
    listed = ", ".join(
        f"{address} has {count}" + (" (short already)" if count < wait_replicas else "")
        for address, count in short
    )
    return (
        f"IRREV_WAIT_REPLICAS={wait_replicas} needs {needed} replicas per primary to "
        f"survive one failure and {listed}: when one of its replicas dies or is promoted "
        f"by a failover, fewer than {wait_replicas} are left to acknowledge and every "
        f"admission there fails closed (not_replicated) until it is back; give each "
        f"primary {needed} replicas, or lower IRREV_WAIT_REPLICAS"
    )
