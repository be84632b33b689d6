"""The ledger's async Python API: one Redis round trip per operation.

`Ledger` is its connection and the shared call path (`LedgerCore`: scripts, waits,
the hold scripts' archive-aware path) with one mixin per family of commands, each in
its own module: holds, transitions, snapshots (reads), accounts, pools, detectors,
learning, rules, leasing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from redis import exceptions as redis_errors

from . import validate
from .accounts import Accounts
from .archive import RESTORE_TRIES, restore
from .calls import Scripts
from .cluster import MIGRATION_WAIT_S, RedisClient
from .connect import MAX_CONNECTIONS, POOL_TIMEOUT_S, connect
from .detectors import Detectors
from .durability import (
    WAIT_AOF_MODES,
    Durability,
    Probe,
    WaitAof,
    WriteProbe,
    probe_waits,
    probe_write,
    read_durability,
    read_replicas,
)
from .embedded import redis_url
from .errors import BadInput, LedgerUnavailable, RedisFailure, redis_failure, translate_redis_errors
from .group import MAX_WAIT_MS
from .holds import DAY_MS, Holds
from .keys import hold_keys, settling_keys, tenant_keys
from .keystore import KeyStore
from .learning import Learning
from .leasing import Leasing
from .policystore import PolicyStore
from .pools import Pools
from .records import NO_ACKS, Acks, TransitionResult
from .refusals import RefusalCounts
from .release import FleetRelease
from .replies import transition_result
from .rules import Rules
from .settings import LedgerSettings
from .snapshots import Snapshots
from .topology import topology_of
from .transitions import Transitions

DENIED_RETENTION_MS = 10 * 60 * 1000
MAX_REPLICAS = 64
MAX_REPLICA_TIMEOUT_MS = 60_000
log = logging.getLogger("irrev.ledger")
MAX_CACHED_TENANTS = 10_000


class LedgerCore:
    """A Ledger's connection and the call path its families share (see Ledger)."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        retention_ms: int = 7 * DAY_MS,
        denied_retention_ms: int = DENIED_RETENTION_MS,
        replicas: int = 0,
        replica_timeout_ms: int = 100,
        wait_aof: WaitAof = "off",
        migration_wait_s: float = MIGRATION_WAIT_S,
        group_wait_ms: float = 0.0,
    ) -> None:
        self.redis = redis
        self.retention_ms = validate.ttl("retention_ms", retention_ms)
        denied = validate.ttl("denied_retention_ms", denied_retention_ms)
        self.denied_retention_ms = min(denied, retention_ms) if retention_ms else denied
        if not 0 <= replicas <= MAX_REPLICAS:
            raise BadInput("replicas", f"must be 0 to {MAX_REPLICAS}")
        if not 0 < replica_timeout_ms <= MAX_REPLICA_TIMEOUT_MS:
            raise BadInput("replica_timeout_ms", f"must be 1 to {MAX_REPLICA_TIMEOUT_MS}")
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        if wait_aof not in WAIT_AOF_MODES:
            raise BadInput("wait_aof", f"must be one of {', '.join(WAIT_AOF_MODES)}")
        self.wait_aof = wait_aof
        # What follows each write that must be kept (WAIT, WAITAOF), on its connection.
        self.waits = _waits(wait_aof, replicas, replica_timeout_ms)
        # Group commit (ledger/group.py): how long a tenant's concurrent reserve or
        # post may wait for others to go with it in one call; 0: each goes alone.
        if not 0 <= group_wait_ms <= MAX_WAIT_MS:
            raise BadInput("group_wait_ms", f"must be 0 to {MAX_WAIT_MS:g}")
        self.group_wait_ms = group_wait_ms
        # Told the operation of each post or true-up kept although its wait came back
        # short (`_report_short`).
        self.on_unacknowledged: Callable[[str], None] | None = None
        # Told the operation (reserve, post) and size of each group group commit sends.
        self.on_group: Callable[[str, int], None] | None = None
        # Standalone or cluster: what the calls below do differently on each.
        self.topology = topology_of(redis)
        # A call its tenant's slot migration refuses is sent again for this long.
        self._scripts = Scripts(self.topology, migration_wait_s)
        self._retention = str(self.retention_ms)
        self._tenant_keys: dict[str, list[str]] = {}
        # The fleet's policies, versioned (gateway hosts serve what it holds).
        self.policies = PolicyStore(redis)
        # Agent and admin keys managed at run time (not in policy files).
        self.keys = KeyStore(redis)
        # How many requests the gateways refused, per tenant and minute.
        self.refusals = RefusalCounts(redis)
        # Which records the fleet's oldest release reads (rolling upgrades).
        self.release = FleetRelease(redis)

    async def aclose(self) -> None:
        await self._scripts.release()
        await self.redis.aclose()

    async def _run(self, operation: str, keys: list[str], args: list[str]) -> Any:
        """One script on its declared `keys` (on a cluster, sent again while its slot
        is moving: TRYAGAIN means it did not run)."""
        try:
            return await self._scripts.call(operation, keys, args)
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
            raise LedgerUnavailable(operation, redis_failure(exc), str(exc)) from exc

    async def _run_replicated(
        self, operation: str, keys: list[str], args: list[str]
    ) -> tuple[Any, Acks]:
        """`_run`, then WAIT or WAITAOF (or both) on the same connection when replicas or
        the AOF's fsync are asked for: the script and the waits go out in one pipeline
        (on a cluster, to the primary of the keys' slot). Returns the reply and what was
        acknowledged (NO_ACKS when nothing is asked for). A script that failed raises
        LedgerUnavailable (it wrote nothing); one that ran is never reported so, as the
        write is there: a wait that answered an error or not its counts acknowledged
        nothing (`_acks`), for the caller to treat as a short count."""
        if not self.waits:
            return await self._run(operation, keys, args), NO_ACKS
        with translate_redis_errors(operation):
            reply, answers = await self._scripts.call_then_wait(operation, keys, args, self.waits)
            if isinstance(reply, Exception):
                raise reply
        return reply, self._acks(operation, answers)

    def _acks(self, operation: str, answers: list[Any]) -> Acks:
        """What the waits' `answers` acknowledged. A wait that answered an error
        (WAITAOF with the AOF turned off under the ledger, a Redis user denied WAIT or
        WAITAOF) or something that is not its counts acknowledged nothing of what it
        counts: WAIT's replicas 0, WAITAOF's fsynced 0 (and its replicas 0 under
        "all"); another wait's answer still counts."""
        replicas: int | None = None
        fsynced: int | None = None
        for (command, *_), answer in zip(self.waits, answers, strict=True):
            try:
                if isinstance(answer, Exception):
                    raise answer
                if command == "WAIT":
                    replicas = int(answer)
                else:  # WAITAOF: [local fsyncs, replicas that fsynced]
                    fsynced = int(answer[0])
                    if self.wait_aof == "all":
                        replicas = int(answer[1])
            except (redis_errors.RedisError, TypeError, ValueError, IndexError, KeyError) as exc:
                log.warning(
                    "a write's %s answered %r: counted as acknowledged by nothing",
                    command,
                    exc if isinstance(exc, redis_errors.RedisError) else answer,
                    extra={"operation": operation},
                )
                if command == "WAIT" or self.wait_aof == "all":
                    replicas = 0
                if command != "WAIT":
                    fsynced = 0
        return Acks(replicas, fsynced)

    def acknowledged(self, answers: list[Any]) -> bool:
        """Whether the answers of the ledger's waits (after `pipeline`) acknowledge its
        writes as a reserve's must be (True when no waits are asked for)."""
        if not self.waits:
            return True
        return not self._short(self._acks("archive", answers))

    def _short(self, acked: Acks) -> bool:
        """Whether the waits acknowledged less than the ledger asks for."""
        return acked.fsynced == 0 or (acked.replicas is not None and acked.replicas < self.replicas)

    async def pipeline(
        self, commands: list[tuple[Any, ...]], key: str
    ) -> tuple[list[Any], list[Any]]:
        """Raw commands on the primary of `key`'s slot in one pipeline, then the
        ledger's waits on the same connection: their replies (errors in place) and the
        waits' answers."""
        return await self._scripts.pipeline(commands, key, self.waits)

    def _report_short(self, operation: str, tenant: str, hold_id: str, acked: Acks) -> None:
        """A post or true-up whose wait came back short is kept anyway (the effect
        happened: refusing to record it would not undo it), so a restart or a
        failover within the window could lose it: logged, and told to
        `on_unacknowledged` (the gateway counts it). The result carries the counts:
        a caller that can repeat it (the holds API's settler) is told to, and the
        repeat's own wait covers it (a replay writes, post.lua)."""
        if not self._short(acked):
            return
        log.warning(
            "write acknowledged without its wait",
            extra={
                "operation": operation,
                "tenant": tenant,
                "hold": hold_id,
                "replicas": acked.replicas,
                "wanted": self.replicas,
                "fsynced": acked.fsynced,
            },
        )
        if self.on_unacknowledged is not None:
            self.on_unacknowledged(operation)

    async def send(self, command: tuple[str | int, ...], key: str) -> Any:
        """One raw command sent the way the ledger sends its scripts (`key`: a key of
        the command, which on a cluster names the node): for benchmarks, to time a
        trivial script through the same path. Redis errors are raised as they are."""
        return await self._scripts.send(command, key)

    async def durability(self) -> Durability:
        """The server's appendonly, appendfsync and min-replicas-to-write ("unknown"
        where CONFIG GET is refused)."""
        with translate_redis_errors("reading the persistence settings"):
            return await read_durability(self.topology)

    @property
    def clustered(self) -> bool:
        """Whether the ledger is on a Redis Cluster."""
        return self.topology.clustered

    async def replicas_per_primary(self) -> dict[str, int] | None:
        """How many replicas each primary has now, by its address (None where the
        server refuses INFO or CLUSTER NODES): what failover_shortfall judges."""
        with translate_redis_errors("reading the replicas of each primary"):
            return await read_replicas(self.topology)

    async def probe_waits(self) -> Probe:
        """A probe write followed by the waits every kept write gets (`waits`), on
        each primary: whether they can succeed here (durability.probe_waits). Nothing
        to probe when no wait is asked for."""
        if not self.waits:
            return Probe()
        with translate_redis_errors("probing the waits for replicas and fsyncs"):
            return await probe_waits(self.topology, self.waits)

    async def probe_write(self) -> WriteProbe:
        """Whether Redis takes a write now: a probe write of a key of irrev's namespace
        that expires (no tenant's) on each primary (durability.probe_write), and why
        each that refused it did, cause and remedy (LedgerUnavailable's message).
        LedgerUnavailable if Redis cannot be reached."""
        with translate_redis_errors("the probe write"):
            answers = await probe_write(self.topology)
        refusals = tuple(
            str(LedgerUnavailable(f"the probe write of {key}", redis_failure(exc), str(exc)))
            for key, exc in answers
            if exc is not None
        )
        return WriteProbe(len(answers), refusals)

    async def ping(self) -> None:
        with translate_redis_errors("ping"):
            await self.redis.ping()

    async def load_scripts(self) -> None:
        """Load the ledger's Functions library (or its scripts, on Redis 6.2) now, so
        the first admission does not pay for it (what a gateway does at start).
        Refused on a node of a Redis Cluster with a standalone client, which most
        calls would find sent elsewhere."""
        with translate_redis_errors("loading the ledger scripts"):
            if await self.topology.mismatched():
                raise LedgerUnavailable(
                    "loading the ledger scripts",
                    RedisFailure.CLUSTER_REDIRECT,
                    "the server is a node of a Redis Cluster and this ledger's client a "
                    "standalone one; Ledger.from_url detects a cluster",
                )
            await self._scripts.load()

    async def scripts_loaded(self) -> bool:
        """Whether Redis still has the library or every script (6.2 forgets scripts
        on restart; a call that finds them missing loads them again)."""
        with translate_redis_errors("checking the ledger scripts"):
            return await self._scripts.loaded()

    async def uses_functions(self) -> bool:
        """Whether the ledger runs as a Redis Functions library (Redis 7+: FCALL)
        rather than as scripts (6.2: EVALSHA); loads them if not yet loaded."""
        if not self._scripts.heads:
            await self.load_scripts()
        return self._scripts.functions

    async def now_ms(self) -> int:
        """Redis's clock, in ms: the clock of hold deadlines and journal entry ids."""
        with translate_redis_errors("reading the clock"):
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _hold_args(self, hold_id: str) -> list[str]:
        return [validate.identifier("hold_id", hold_id), self._retention]

    def _hold_keys(self, tenant: str, hold_id: str) -> list[str]:
        """hold_script_keys, with the tenant's five built (and checked) once."""
        prefix = self._tenant_keys.get(tenant)
        if prefix is None:
            if len(self._tenant_keys) >= MAX_CACHED_TENANTS:
                self._tenant_keys.clear()
            prefix = self._tenant_keys[tenant] = tenant_keys(validate.tenant_id(tenant))
        return [*prefix, *hold_keys(tenant, validate.identifier("hold_id", hold_id))]

    async def _transition(
        self, operation: str, tenant: str, hold_id: str, args: list[str], replicated: bool = False
    ) -> TransitionResult:
        """`replicated`: followed by WAIT / WAITAOF (when asked for), as a post or a
        true-up may be an overrun: a charge lost in a failover would let the account
        be overdrawn again; and a retry's claim is followed by the effect's send,
        whose charge (the reserve before it on the same primary, which its wait
        counts too) a failover must not lose."""
        keys = settling_keys(self._hold_keys(tenant, hold_id), tenant, operation, args)
        if replicated:
            reply, acked = await self._on_hold(operation, tenant, hold_id, keys, args)
            result = transition_result(tenant, hold_id, operation, reply, acked)
            if operation != "retry":  # a short retry claim is refused: nothing to lose
                self._report_short(operation, tenant, hold_id, acked)
            return result
        reply, _ = await self._on_hold(operation, tenant, hold_id, keys, args, replicated=False)
        return transition_result(tenant, hold_id, operation, reply)

    async def _on_hold(
        self,
        operation: str,
        tenant: str,
        hold_id: str,
        keys: list[str],
        args: list[str],
        *,
        replicated: bool = True,
    ) -> tuple[Any, Acks]:
        """A script about one hold (`_run_replicated`, or `_run` unless `replicated`).
        One that finds the hold archived out of the tenant's slot (reserve answers
        'archived', the others 'not_found': ledger/archive.py) gets it restored and is
        run again."""
        for _ in range(RESTORE_TRIES):
            if replicated:
                reply, acked = await self._run_replicated(operation, keys, args)
            else:
                reply, acked = await self._run(operation, keys, args), NO_ACKS
            if reply[0] not in ("archived", "not_found"):
                break
            if not await restore(self, tenant, hold_id):
                break
        else:
            if reply[0] == "archived":  # out again each time (archive.RESTORED_KEEP_MS)
                detail = f"hold {hold_id!r} was archived again each time it was restored"
                raise LedgerUnavailable(operation, RedisFailure.BUSY, detail)
        return reply, acked


class Ledger(
    Holds,
    Transitions,
    Snapshots,
    Accounts,
    Pools,
    Detectors,
    Learning,
    Rules,
    Leasing,
    LedgerCore,
):
    """Accounts, holds and the journal of every tenant, kept in one Redis.

    `retention_ms` is how long a settled hold (and with it its idempotency key) is
    kept; a replay after that is a new request. A denied one is kept for
    `denied_retention_ms` (at most `retention_ms`): it only serves replays of the
    refusal, and a refused request made again after that is decided again, which
    is harmless since nothing was held or sent.

    `replicas` > 0: a reserve or an approval is followed, on the same connection and
    in the same round trip, by WAIT for that many replicas (at most
    `replica_timeout_ms`), and its result says how many acknowledged. Redis fails
    over to a replica without the writes it had not received, so an admission that
    no replica holds can vanish with the primary: its caller should not act on it.

    `wait_aof` (Redis 7.2+, Valkey): "local" follows every such write by WAITAOF 1 0
    too, for the primary's fsync of its append-only file: the result's `fsynced` says
    whether it was (1) or not in time (0). With `appendfsync always` the fsync precedes
    the reply, so it costs a round trip's bytes; with `everysec` the wait for the next
    fsync (measured ~100 ms on Valkey 8). "all" sends WAITAOF 1 `replicas` instead of
    WAIT: `replicas` then counts replicas that fsynced the write, which they report
    about once a second (measured ~1 s a write on Valkey 8). "off": WAIT alone.

    `group_wait_ms` > 0 (at most 10; the gateway's IRREV_GROUP_WAIT_MS): group
    commit. A tenant's concurrent reserves, and its concurrent posts, go as one script
    call each, a call waiting at most that long for others (ledger/group.py); a call
    with none beside it goes at once. Each keeps its own result and idempotency.
    """

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        retention_ms: int = 7 * DAY_MS,
        denied_retention_ms: int = DENIED_RETENTION_MS,
        replicas: int = 0,
        replica_timeout_ms: int = 100,
        wait_aof: WaitAof = "off",
        max_connections: int = MAX_CONNECTIONS,
        pool_timeout_s: float = POOL_TIMEOUT_S,
        migration_wait_s: float = MIGRATION_WAIT_S,
        group_wait_ms: float = 0.0,
        **options: Any,
    ) -> Ledger:
        """A Ledger on the server at `url`, through `connect` (which see for the
        connection options)."""
        return cls(
            connect(url, max_connections=max_connections, pool_timeout_s=pool_timeout_s, **options),
            retention_ms=retention_ms,
            denied_retention_ms=denied_retention_ms,
            replicas=replicas,
            replica_timeout_ms=replica_timeout_ms,
            wait_aof=wait_aof,
            migration_wait_s=migration_wait_s,
            group_wait_ms=group_wait_ms,
        )


def _waits(wait_aof: WaitAof, replicas: int, timeout_ms: int) -> list[tuple[Any, ...]]:
    """What follows a write that must be kept: WAITAOF 1 N where replicas must have
    fsynced it ("all"); else WAITAOF 1 0 for the primary's own fsync ("local"), first,
    as with appendfsync always it answers at once, and WAIT N for replicas."""
    if wait_aof == "all":
        return [("WAITAOF", 1, replicas, timeout_ms)]
    waits: list[tuple[Any, ...]] = []
    if wait_aof == "local":
        waits.append(("WAITAOF", 1, 0, timeout_ms))
    if replicas:
        waits.append(("WAIT", replicas, timeout_ms))
    return waits


@asynccontextmanager
async def open_ledger(settings: LedgerSettings | None = None) -> AsyncIterator[Ledger]:
    """A Ledger on the configured Redis (`IRREV_REDIS_URL`), or on the embedded one
    started (or joined) for as long as the block runs."""
    with redis_url(settings or LedgerSettings()) as url:
        ledger = Ledger.from_url(url)
        try:
            yield ledger
        finally:
            await ledger.aclose()
