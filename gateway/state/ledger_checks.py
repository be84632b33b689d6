"""What a worker checks of the ledger's Redis before it serves: the scripts loaded
(waiting a while for an embedded Redis that restarts), the fleet's release, the
server's persistence and the waits IRREV_WAIT_AOF and IRREV_WAIT_REPLICAS ask for,
and how many replicas each primary has."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.settings import GatewaySettings
from ledger import Durability, Ledger, LedgerUnavailable, RedisFailure, failover_shortfall

log = logging.getLogger("irrev.gateway")
LEDGER_START_WAIT_S = 5.0
# appendfsync everysec's promise (a write is fsynced within about a second), and how
# often a replica reports its fsyncs (REPLCONF ACK).
FSYNC_REPORT_MS = 1000


async def load_scripts(ledger: Ledger) -> None:
    """A worker replaced while `irrev serve` restarts its embedded Redis waits for it
    (a worker that cannot start stops the whole gateway); a Redis still unreachable
    after LEDGER_START_WAIT_S fails the start."""
    deadline = time.monotonic() + LEDGER_START_WAIT_S
    while True:
        try:
            await ledger.load_scripts()
            return
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def read_release(ledger: Ledger) -> None:
    """Read the fleet's release flag; a fleet in a rolling upgrade is logged once."""
    await ledger.release.read()
    if not ledger.release.upgraded:
        log.warning(
            "fleet in a rolling upgrade",
            extra={
                "release_format": ledger.release.format,
                "writes": "records every release since format 1 reads, until "
                "`irrev ledger upgrade finish` (docs/operations.md, Rolling upgrades)",
            },
        )


async def check_durability(ledger: Ledger, settings: GatewaySettings) -> None:
    """Report the server's persistence; refuse to start on one that can lose an
    acknowledged write if IRREV_DURABILITY=require, and whatever IRREV_DURABILITY
    says on one that cannot do the WAITAOF IRREV_WAIT_AOF asks for (every write
    would fail)."""
    found = await ledger.durability()
    if settings.wait_aof != "off" and (refusal := found.wait_aof_refusal()):
        raise LedgerUnavailable("start", RedisFailure.NO_WAITAOF, refusal)
    # The settings do not show an ACL that denies WAITAOF or WAIT, a renamed command,
    # or replicas that do not fsync: a write followed by the very waits shows them.
    probe = await ledger.probe_waits()
    if probe.refusal:
        waits_refused = settings.wait_aof != "off" and not probe.write_refused
        cause = RedisFailure.NO_WAITAOF if waits_refused else RedisFailure.REFUSED
        raise LedgerUnavailable("start", cause, probe.refusal)
    if probe.warning:
        log.warning("ledger waits", extra={"shortfall": probe.warning})
    shortfall = found.shortfall(settings.wait_replicas, probe.fsynced)
    facts = {
        "appendonly": found.appendonly,
        "appendfsync": found.appendfsync,
        "min_replicas_to_write": found.min_replicas_to_write,
        "wait_replicas": settings.wait_replicas,
        "wait_aof": settings.wait_aof,
        "waitaof": found.waitaof,
    }
    if slow := _slow_fsyncs(found, settings):
        log.warning("ledger durability", extra={**facts, "shortfall": slow})
    if not shortfall:
        log.info("ledger durability", extra=facts)
    elif settings.durability == "require":
        raise LedgerUnavailable("start", RedisFailure.NOT_DURABLE, shortfall)
    else:
        log.warning("ledger durability", extra={**facts, "shortfall": shortfall})
    if settings.wait_replicas:
        await _check_topology(ledger, settings.wait_replicas)


async def _check_topology(ledger: Ledger, wait_replicas: int) -> None:
    """Warn when one failure (a replica's death, a failover) would leave a primary
    with fewer replicas than IRREV_WAIT_REPLICAS: admissions there would then fail
    closed until it is back. A warning, not a refusal: it serves until then."""
    replicas = await ledger.replicas_per_primary()
    facts: dict[str, Any] = {"wait_replicas": wait_replicas, "replicas": replicas}
    if replicas is None:
        shortfall = (
            "the replicas of each primary could not be read (INFO replication or CLUSTER "
            f"NODES refused): make sure each has {wait_replicas + 1}, or one failure stops "
            "admissions"
        )
    else:
        shortfall = failover_shortfall(replicas, wait_replicas)
    if shortfall:
        log.warning("ledger topology", extra={**facts, "shortfall": shortfall})
    else:
        log.info("ledger topology", extra=facts)


def _slow_fsyncs(found: Durability, settings: GatewaySettings) -> str:
    """Why IRREV_WAIT_TIMEOUT_MS is likely too short for the fsyncs IRREV_WAIT_AOF
    waits for ("" if not): writes would fail closed. With everysec, WAITAOF waits for
    the next fsync (measured ~100 ms on Valkey 8, within a second by the setting's
    promise); replicas report their fsyncs once a second (measured ~1 s a write)."""
    timeout = settings.wait_timeout_ms
    if settings.wait_aof == "all" and settings.wait_replicas and timeout < 2 * FSYNC_REPORT_MS:
        return (
            f"replicas report their fsyncs about every {FSYNC_REPORT_MS} ms and "
            f"IRREV_WAIT_TIMEOUT_MS is {timeout}: writes may fail with not_replicated"
        )
    everysec = "everysec" in found.appendfsync.split("|")
    if settings.wait_aof != "off" and everysec and timeout < FSYNC_REPORT_MS:
        return (
            f"appendfsync everysec fsyncs up to {FSYNC_REPORT_MS} ms after a write and "
            f"IRREV_WAIT_TIMEOUT_MS is {timeout}: writes may fail with not_fsynced"
        )
    return ""
