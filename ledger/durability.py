"""What the ledger's Redis does to keep a write: its persistence settings, read with
CONFIG GET at start (a managed Redis may refuse CONFIG: then they are unknown),
whether it has WAITAOF (by its version: Redis 7.2+, Valkey), whether the waits a
kept write gets succeed there (a probe write), and whether that meets what the
gateway is told to require."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from redis import exceptions as redis_errors

from .topology import Topology

PARAMETERS = ("appendonly", "appendfsync", "min-replicas-to-write")
UNKNOWN = "unknown"
WAITAOF_SINCE = (7, 2)
# What a write that must be kept waits for besides replicas (Ledger's wait_aof): no
# fsync, the primary's, or the primary's and every counted replica's.
WaitAof = Literal["off", "local", "all"]
WAIT_AOF_MODES: tuple[str, ...] = get_args(WaitAof)


@dataclass(frozen=True, slots=True)
class Durability:
    """The server's settings as read ("unknown" where CONFIG GET was refused; on a
    cluster, every primary's value, "a|b" where they differ)."""

    appendonly: str
    appendfsync: str
    min_replicas_to_write: str
    # "yes" where the server knows WAITAOF, "no" where not (Redis < 7.2).
    waitaof: str = UNKNOWN

    def shortfall(self, wait_replicas: int, fsync_proven: bool = False) -> str:
        """Why an acknowledged write could be lost on a restart ("" if it cannot): AOF
        off, or fsynced by the OS only (`appendfsync no`), or the settings unknown;
        unless `wait_replicas` replicas must acknowledge each admission and limit
        change (IRREV_WAIT_REPLICAS), so a failover keeps it, or `fsync_proven`: a
        probe's WAITAOF saw the primary fsync a write (`probe_waits`), and each of
        those writes waits for its own fsync, so unread settings do not matter."""
        if wait_replicas > 0 or fsync_proven:
            return ""
        if UNKNOWN in (self.appendonly, self.appendfsync):
            return "the server's persistence could not be read (CONFIG GET refused)"
        if self.appendonly != "yes":
            return f"appendonly is {self.appendonly}: a restart loses writes since the last save"
        if self.appendfsync not in ("always", "everysec"):
            return f"appendfsync is {self.appendfsync}: a crash loses what the OS had not written"
        return ""

    def wait_aof_refusal(self) -> str:
        """Why WAITAOF 1 (IRREV_WAIT_AOF local or all) could not acknowledge a write here (""
        if it can): every admission would then fail, so a gateway does not start.
        Without WAITAOF the server answers it with an error; with appendonly off
        WAITAOF refuses numlocal 1; with appendfsync no the server never fsyncs
        for it, so every wait runs out. Settings CONFIG GET could not read are
        left to the first write, which fails closed if they fall short."""
        if "no" in self.waitaof.split("|"):
            return "the server has no WAITAOF (it needs Redis 7.2+ or Valkey)"
        if "no" in self.appendonly.split("|"):
            return "appendonly is no: WAITAOF cannot wait for a local fsync"
        if "no" in self.appendfsync.split("|"):
            return "appendfsync is no: the server never fsyncs for WAITAOF, every wait runs out"
        return ""


@dataclass(frozen=True, slots=True)
class WriteProbe:
    """What a probe write showed (Ledger.probe_write): of `primaries` (one but on a
    Redis Cluster), why each that refused it did."""

    primaries: int
    refusals: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        """No primary takes writes: every admission would be refused."""
        return len(self.refusals) == self.primaries


async def read_durability(topology: Topology) -> Durability:
    appendonly, appendfsync, min_replicas = [await _config(topology, name) for name in PARAMETERS]
    return Durability(appendonly, appendfsync, min_replicas, await _has_waitaof(topology))


async def _has_waitaof(topology: Topology) -> str:
    """'yes' or 'no' (on a cluster, every primary's answer, "no|yes" where they
    differ): whether the server's Redis version (INFO server's redis_version, which
    Valkey reports as the Redis it is compatible with) is 7.2 or later, the first
    with WAITAOF. (COMMAND INFO would say it directly, but redis-py's parser fails
    on its answer for a command the server lacks.)"""
    redis = topology.redis
    try:
        infos = await topology.each_primary(lambda **node: redis.info("server", **node))
        return _joined({_known(info) for info in infos})
    except redis_errors.ResponseError:
        return UNKNOWN  # INFO not allowed (ACLs)


async def read_replicas(topology: Topology) -> dict[str, int] | None:
    """How many replicas each primary has now (its address -> count; None where
    the server refuses the read, ACLs): INFO replication's connected_slaves on a
    standalone server, the cluster's own view (CLUSTER NODES) on a cluster: a
    replica flagged failing does not count, a primary without slots serves nothing."""
    try:
        return await topology.replicas()
    except redis_errors.ResponseError:
        return None  # INFO or CLUSTER not allowed (ACLs)


def _known(info: dict[str, object]) -> str:
    parts = str(info.get("redis_version", "")).split(".")
    if len(parts) < 2 or not all(part.isdigit() for part in parts[:2]):
        return UNKNOWN
    return "yes" if (int(parts[0]), int(parts[1])) >= WAITAOF_SINCE else "no"


async def _config(topology: Topology, name: str) -> str:
    redis = topology.redis
    try:
        replies = await topology.each_primary(lambda **node: redis.config_get(name, **node))
        return _joined({str(reply.get(name, UNKNOWN)) for reply in replies})
    except redis_errors.ResponseError:
        return UNKNOWN  # CONFIG renamed or not allowed (managed Redis, ACLs)


def _joined(found: set[str]) -> str:
    """Every primary's value, "a|b" where they differ."""
    return "|".join(sorted(found)) or UNKNOWN


# The probe's key: irrev's namespace, gone by itself soon after the last probe.
PROBE_KEY = "irrev:probe:{%s}"
PROBE_TTL_MS = 10_000
# How long the probe waits at least: it asks whether the server can fsync for
# WAITAOF at all, not whether it does so within IRREV_WAIT_TIMEOUT_MS (everysec
# fsyncs within about a second, replicas report theirs about once a second), which
# the gateway warns about separately.
PROBE_WAIT_MS = 3_000


@dataclass(frozen=True, slots=True)
class Probe:
    """What a probe write followed by the gateway's waits showed: `refusal`, why
    every write would fail ("" if none would); `warning`, replicas that did not
    acknowledge it now (down or not attached yet: writes fail until they are back);
    `fsynced`, whether every primary fsynced it (WAITAOF's local count 1)."""

    refusal: str = ""
    warning: str = ""
    fsynced: bool = False
    write_refused: bool = False  # the refusal is of the probe's write, not of a wait


async def probe_waits(topology: Topology, waits: list[tuple[Any, ...]]) -> Probe:
    """A harmless write (a key of irrev's namespace that expires) on each primary,
    followed on its connection by `waits`, the WAIT/WAITAOF every kept write gets
    (ledger/client.py's `_waits`), with at least PROBE_WAIT_MS: an ACL that denies
    them, a renamed or missing command, a primary that never fsyncs and replicas
    that receive writes but do not fsync them (appendonly no on a replica) show here,
    where the server's version and CONFIG GET do not tell."""
    waits = [(*wait[:-1], max(int(wait[-1]), PROBE_WAIT_MS)) for wait in waits]
    keys = await topology.key_per_primary(PROBE_KEY)
    # At once: each may wait its full timeout for replicas that are away.
    probes = list(await asyncio.gather(*(_probe_on(topology, key, waits) for key in keys)))
    refused = next((p for p in probes if p.refusal), None)
    warning = next((p.warning for p in probes if p.warning), "")
    if refused is not None:
        return replace(refused, warning=warning)
    return Probe("", warning, all(p.fsynced for p in probes))


async def probe_write(topology: Topology) -> list[tuple[str, Exception | None]]:
    """The probe write alone on each primary (PROBE_KEY: irrev's namespace, no
    tenant's, expiring): per probe key, the error that refused it, or None. Whether
    Redis takes writes at all is what neither a PING nor a read shows: a server at
    `maxmemory` under `noeviction`, a primary demoted to a replica, one short of its
    `min-replicas-to-write` answer both and refuse every admission. Connection errors
    are raised."""
    keys = await topology.key_per_primary(PROBE_KEY)
    writes = (topology.pipeline(key, [_probe_set(key)]) for key in keys)
    replies = [reply[0] for reply in await asyncio.gather(*writes)]
    refused = [r if isinstance(r, Exception) else None for r in replies]
    return list(zip(keys, refused, strict=True))


def _probe_set(key: str) -> tuple[Any, ...]:
    return ("SET", key, "1", "PX", PROBE_TTL_MS)


async def _probe_on(topology: Topology, key: str, waits: list[tuple[Any, ...]]) -> Probe:
    where = topology.where(key)
    commands = [_probe_set(key), *waits]
    aof_all = bool(waits) and waits[0][0] == "WAITAOF" and int(waits[0][2]) > 0
    if aof_all:
        # Whether replicas that did not fsync at least received the write: a short
        # check (answers at once when they did), so that a replica that is down is
        # told from one that does not fsync.
        commands.append(("WAIT", waits[0][2], 100))
    replies = await topology.pipeline(key, commands)
    if isinstance(replies[0], Exception):
        return Probe(
            f"the probe write SET {key} was refused{where} ({replies[0]}): let the ledger's "
            "Redis user write irrev:probe:* (ACL: +set ~irrev:probe:*)",
            write_refused=True,
        )
    fsynced = False
    warning = ""
    for wait, answer in zip(waits, replies[1 : 1 + len(waits)], strict=True):
        name, wanted = str(wait[0]), int(wait[-2])
        if isinstance(answer, Exception):
            return Probe(f"{name} was refused{where}: {answer}")
        if name == "WAIT":
            if int(answer) < wanted:
                warning = f"{answer} of {wanted} replicas acknowledged the probe write{where}"
            continue
        local, replicas = int(answer[0]), int(answer[1])
        if local < 1:
            return Probe(
                f"the primary did not fsync the probe write to its AOF in {wait[-1]} ms{where} "
                "(is its appendfsync no?)"
            )
        fsynced = True
        if replicas < wanted:
            received = replies[-1]
            short = f"{replicas} of {wanted} replicas fsynced the probe write in {wait[-1]} ms"
            if not isinstance(received, Exception) and int(received) >= wanted:
                return Probe(
                    f"{short}{where}: the replicas did not fsync (is their appendonly on?)"
                )
            warning = f"{short}{where}, {received} received it"
    return Probe("", warning, fsynced)
