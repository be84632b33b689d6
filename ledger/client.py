"""The ledger's async Python API: one Redis round trip per operation."""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from itertools import count, takewhile
from typing import Any, TypeVar

from redis import exceptions as redis_errors

from . import validate
from .archive import RESTORE_TRIES, read_archived, restore
from .calls import Scripts
from .cluster import MIGRATION_WAIT_S, RedisClient
from .connect import MAX_CONNECTIONS, POOL_TIMEOUT_S, connect
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
from .errors import (
    BadInput,
    LedgerError,
    LedgerUnavailable,
    RedisFailure,
    open_pool,
    raise_for_reply,
    redis_failure,
    translate_redis_errors,
)
from .keys import (
    TENANTS_KEY,
    account_fields,
    accounts_key,
    ambiguous_key,
    content_key,
    deadlines_key,
    escalated_key,
    factors_key,
    hold_key,
    hold_keys,
    hold_script_keys,
    lease_key,
    observed_key,
    reserve_keys,
    rules_key,
    settled_key,
    tenant_keys,
    webhook_cursor_key,
    webhook_lease_key,
)
from .keystore import KeyStore
from .lease import Lease, Watch
from .policystore import PolicyStore
from .records import (
    DECIDED_BY,
    NO_ACKS,
    AccountCheck,
    AccountSpec,
    Acks,
    Approval,
    Attached,
    Balance,
    Decision,
    Hold,
    HoldState,
    OpenPool,
    PoolTicket,
    Provenance,
    Reason,
    ReserveRequest,
    ReserveResult,
    RouteFactors,
    RouteOutcomes,
    Rule,
    Status,
    SweepResult,
    TenantSnapshot,
    TransitionResult,
)
from .refusals import RefusalCounts
from .release import COUNTED_ESCALATIONS, FleetRelease
from .settings import LedgerSettings
from .topology import topology_of

DAY_MS = 24 * 3600 * 1000
DENIED_RETENTION_MS = 10 * 60 * 1000
MAX_REPLICAS = 64
MAX_REPLICA_TIMEOUT_MS = 60_000
T = TypeVar("T")
log = logging.getLogger("irrev.ledger")
# reserve.lua's answer while holds are due, the flag that makes it decide anyway, and
# the one that makes it look for due holds before any decision (a batch's items).
EXPIRE_FIRST = "expire_first"
DECIDE_ANYWAY = "1"
IN_ORDER = "2"
SWEEP_BATCH = 100
MAX_CACHED_TENANTS = 10_000
# A packed Provenance: reserve.lua's MAX_PROVENANCE (a path of an unknown route is
# the route id; HTTP servers refuse a request line past 16 KiB).
MAX_PROVENANCE_BYTES = 16384
MAX_SWEEPS_BEFORE_RESERVE = 10
HOLD_READS = 3
# Generations of one keyless content a call walks through before it gives up: the
# index jumps it to the newest, so more than two steps mean the index was lost while
# old settled holds remain (attach.lua).
MAX_ATTACH_STEPS = 64
# close_idle_accounts: accounts asked for per HSCAN page, and named per close.lua call.
CLOSE_SCAN = 500
CLOSE_BATCH = 500


class Ledger:
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
    """

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
        # Told the operation of each post or true-up kept although its wait came back
        # short (`_report_short`).
        self.on_unacknowledged: Callable[[str], None] | None = None
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
        )

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

    def lease(self, tenant: str, work: str, ttl_ms: int, *, holder: str = "") -> Lease:
        """The lease of one kind of background work (`sweep`, `events`) on `tenant`:
        one holder at a time across every process on this Redis (ledger/lease.py).
        `holder` names the taker in the lease's token (default host:pid)."""
        key = lease_key(validate.tenant_id(tenant), work)
        return Lease(self.redis, key, ttl_ms, holder=holder)

    def watch(self, ttl_ms: int, *, holder: str = "") -> Watch:
        """The fleet's watch (ledger/lease.py Watch): one holder at a time across every
        process on this Redis beats and does the fleet-wide checks."""
        return Watch(self.redis, ttl_ms, holder=holder)

    async def free_leases(self, tenants: Sequence[str]) -> set[tuple[str, str]]:
        """(tenant, 'sweep' or 'webhook') of each lease of `tenants` nobody holds now,
        in one round trip (a read of each: the fleet's watcher looks for lapsed ones,
        so that no process need keep asking for leases it does not hold)."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        keys = {(tenant, "sweep"): lease_key(tenant, "sweep") for tenant in names}
        keys |= {(tenant, "webhook"): webhook_lease_key(tenant) for tenant in names}
        if not keys:
            return set()
        leases = list(keys)
        with translate_redis_errors("reading leases"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for lease in leases:
                    pipe.exists(keys[lease])
                held = await pipe.execute()
        return {lease for lease, found in zip(leases, held, strict=True) if not found}

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

    # Accounts

    async def upsert_account(
        self, tenant: str, spec: AccountSpec, policy_version: int | None = None
    ) -> str:
        """Create the account or change its policy; returns 'created' or 'updated', or
        'kept' if the account holds a newer `policy_version`'s limits (None: written
        whatever it holds). With replicas asked for, followed by WAIT: a lowered
        limit lost in a failover would admit up to the old one; LedgerUnavailable
        (not_replicated) if fewer acknowledged, for the caller to write it again."""
        keys = tenant_keys(validate.tenant_id(tenant))[:2]
        args = validate.upsert_args(spec)
        if policy_version is not None:
            args.append(str(validate.amount("policy_version", policy_version)))
        reply, acked = await self._run_replicated("account", keys, args)
        raise_for_reply(tenant, "", "upsert", reply)
        if acked.fsynced == 0:
            raise LedgerUnavailable(
                "upsert",
                RedisFailure.NOT_FSYNCED,
                f"the primary had not fsynced the account change to its AOF in "
                f"{self.replica_timeout_ms} ms; write it again",
            )
        if acked.replicas is not None and acked.replicas < self.replicas:
            counted = "fsynced" if self.wait_aof == "all" else "acknowledged"
            raise LedgerUnavailable(
                "upsert",
                RedisFailure.NOT_REPLICATED,
                f"{acked.replicas} of {self.replicas} replicas {counted} the account change "
                f"in {self.replica_timeout_ms} ms; write it again once they are back",
            )
        # The list of tenants is a key of its own slot, kept for operators (audit);
        # nothing on the admission path reads it. A store's first tenant registered
        # with the release flag decided tells an older release's store from a new one.
        await self.release.decided()
        with translate_redis_errors("upsert"):
            await self.redis.sadd(TENANTS_KEY, tenant)
        return str(reply[1])

    async def balance(self, tenant: str, account: str) -> Balance | None:
        key = accounts_key(validate.tenant_id(tenant))
        fields = account_fields(validate.account_id(account))
        with translate_redis_errors("balance"):
            values = await _decoded(self.redis.hmget(key, fields))
        return None if values[0] is None else _balance(account, values)

    async def balances(self, tenant: str) -> list[Balance]:
        """Every account of the tenant, sorted by id."""
        with translate_redis_errors("balances"):
            stored = await _decoded(self.redis.hgetall(accounts_key(validate.tenant_id(tenant))))
        # '~' fields are calibrating routes' open sets (lua/_lib.lua), not accounts.
        accounts = {field.rpartition("|")[0] for field in stored if not field.startswith("~")}
        return [
            _balance(account, [stored.get(field) for field in account_fields(account)])
            for account in sorted(accounts)
        ]

    async def open_pools(self, tenant: str) -> dict[str, OpenPool]:
        """The open holds of each calibrating route of the tenant, by route tag
        (`pool_tag`); a route with none open has no entry."""
        with translate_redis_errors("open pools"):
            stored = await _decoded(self.redis.hgetall(accounts_key(validate.tenant_id(tenant))))
        tags = {f[1:].rpartition("|")[0] for f in stored if f.startswith("~")}
        return {
            tag: OpenPool(
                int(stored.get(f"~{tag}|n", 0)),
                int(stored.get(f"~{tag}|s", 0)),
                float(stored.get(f"~{tag}|q", 0.0)),
            )
            for tag in tags
        }

    async def repair_pools(self, tenant: str) -> dict[str, OpenPool]:
        """Rewrite the open sets of the tenant's pooling routes from its open holds
        (lua/pools.lua), for a set out of step with them (`irrev ledger audit` says
        which): the sets after. The open holds are read first and declared; one opened
        or closed meanwhile makes the script write nothing, and it is read again."""
        tenant = validate.tenant_id(tenant)
        for _ in range(REPAIR_TRIES):
            with translate_redis_errors("repair pools"):
                due = await self.redis.zrange(deadlines_key(tenant), 0, -1)
                ambiguous = await self.redis.smembers(ambiguous_key(tenant))
            ids = sorted({str(h) for h in (*due, *ambiguous)})
            states = [await self._state(tenant, hold_id) for hold_id in ids]
            held = [h for h, st in zip(ids, states, strict=True) if st in ("pending", "ambiguous")]
            keys = [*tenant_keys(tenant), *(hold_keys(tenant, h)[0] for h in held)]
            reply = await self._run("pools", keys, [str(len(held)), *held])
            if str(reply[0]) != "retry":
                raise_for_reply(tenant, "", "repair pools", reply)
                return await self.open_pools(tenant)
        raise LedgerError(
            f"repair pools: the open holds of {tenant} changed during each of "
            f"{REPAIR_TRIES} reads; run it again when the tenant is quieter"
        )

    async def _state(self, tenant: str, hold_id: str) -> str:
        with translate_redis_errors("repair pools"):
            return str(await self.redis.hget(hold_keys(tenant, hold_id)[0], "st") or "")

    async def tenants(self) -> list[str]:
        with translate_redis_errors("tenants"):
            return sorted(await _decoded(self.redis.smembers(TENANTS_KEY)))

    async def outcomes(self, tenants: Sequence[str]) -> dict[str, dict[str, RouteOutcomes]]:
        """The compensation outcomes counted so far (by `learn`) for each tenant, by
        route id, in one round trip."""
        tenants = [validate.tenant_id(tenant) for tenant in tenants]
        with translate_redis_errors("reading compensation outcomes"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(observed_key(tenant, "failures"))
                    pipe.hgetall(observed_key(tenant, "successes"))
                replies = await pipe.execute()
        counted = {}
        for tenant, failures, successes in zip(tenants, replies[::2], replies[1::2], strict=True):
            counted[tenant] = {
                route: RouteOutcomes(int(failures.get(route, 0)), int(successes.get(route, 0)))
                for route in failures.keys() | successes.keys()
            }
        return counted

    async def settled_factors(self, tenants: Sequence[str]) -> dict[str, dict[str, RouteFactors]]:
        """The realised residual factors recorded so far (by `calibrate`) for each
        tenant, by route id, in one round trip."""
        tenants = [validate.tenant_id(tenant) for tenant in tenants]
        with translate_redis_errors("reading settled factors"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(factors_key(tenant))
                replies = await pipe.execute()
        found: dict[str, dict[str, RouteFactors]] = {}
        for tenant, stored in zip(tenants, replies, strict=True):
            fields: dict[str, str] = stored
            routes = {key[2:] for key in fields if key.startswith("n|")}
            found[tenant] = {
                route: RouteFactors(
                    int(fields[f"n|{route}"]),
                    int(fields.get(f"s|{route}", 0)),
                    int(fields.get(f"q|{route}", 0)),
                    tuple(int(x) for x in fields.get(f"t|{route}", "").split(",") if x),
                )
                for route in routes
            }
        return found

    async def now_ms(self) -> int:
        """Redis's clock, in ms: the clock of hold deadlines and journal entry ids."""
        with translate_redis_errors("reading the clock"):
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # Holds

    async def reserve(
        self,
        tenant: str,
        idempotency_key: str,
        fingerprint: str,
        amounts: Mapping[str, int],
        *,
        ttl_ms: int,
        escalation_ttl_ms: int = DAY_MS,
        armed: bool = True,
        escalate_above: int = 0,
        request: str = "",
        open_missing: Sequence[AccountSpec] = (),
        provenance: Provenance | None = None,
        shadow: bool = False,
        pool: PoolTicket | None = None,
    ) -> ReserveResult:
        """Admit, deny or escalate one effect; hold its price on every account or none.

        The idempotency key is the hold's id. `armed` says the caller fires the
        effect as soon as it is admitted, so a pending hold that outlives its
        deadline may have fired and turns ambiguous rather than expiring.
        `request` is kept with the hold until it settles (for an approver who
        forwards it later, or a reconciler who looks it up). `open_missing` names
        accounts of `amounts` to create in the same script if Redis lacks them, only
        when the hold is kept and holds something on them (see reserve.lua).
        `provenance` goes into the journal's reserve entry, with the SHA-256 of
        `request` (see Provenance). `shadow` holds the effect whatever the decision,
        which is only recorded (the result's `shadowed`): shadow mode, where accounts
        may go above their limits. `pool`: the effect is of a calibrating route, whose
        open set its hold joins while open (the result's `pool`: the set after it);
        PoolShrank, with nothing written, if its price assumed a larger set than is
        open.
        """
        reserve = ReserveRequest(
            idempotency_key,
            fingerprint,
            amounts,
            ttl_ms,
            escalation_ttl_ms,
            armed,
            escalate_above,
            request,
            open_missing,
            provenance,
            shadow,
            pool,
        )
        args = self.reserve_args(reserve)  # first: its errors name the idempotency key
        keys = [*self._hold_keys(tenant, idempotency_key), settled_key(tenant)]
        reply, acked = await self._on_hold("reserve", tenant, idempotency_key, keys, args)
        if reply[0] == EXPIRE_FIRST:
            await self._expire_due(tenant)
            args = _deciding(args, pool)
            reply, acked = await self._on_hold("reserve", tenant, idempotency_key, keys, args)
        return _reserve_result(tenant, idempotency_key, reply, acked)

    async def attach(
        self,
        tenant: str,
        content: str,
        hold_id_of: Callable[[int], str],
        *,
        window_ms: int,
        keep_ms: int,
    ) -> Attached:
        """The hold a call without a key of its own is, keyed by its `content` (an id
        the caller derives from what was priced): the newest generation's while it is
        live or settled within `window_ms` (Redis's clock), else the next one's (opened
        by the caller's reserve of that id). `hold_id_of(g)` is generation g's hold id;
        `keep_ms` how long the content's index outlives its last use (lua/attach.lua)."""
        tenant = validate.tenant_id(tenant)
        index = content_key(tenant, validate.identifier("content", content))
        args = [str(validate.amount("window_ms", window_ms)), str(validate.ttl("keep_ms", keep_ms))]
        generation = 1
        for _ in range(MAX_ATTACH_STEPS):
            hold_id = validate.identifier("hold_id", hold_id_of(generation))
            keys = [accounts_key(tenant), index, hold_key(tenant, hold_id), settled_key(tenant)]
            reply = await self._run("attach", keys, [str(generation), *args])
            verdict = str(reply[0])
            if verdict in ("attach", "free"):
                return Attached(hold_id, generation, verdict == "attach")
            if verdict == "archived":  # asked again once it is back in the slot
                await restore(self, tenant, hold_id)
                continue
            if verdict not in ("next", "ahead"):
                raise_for_reply(tenant, hold_id, "attach", reply)
            generation = int(reply[1])
        raise BadInput("content", f"more than {MAX_ATTACH_STEPS} settled generations to walk")

    async def pace_reads(self, tenant: str, accounts: Sequence[str]) -> None:
        """One read against the read rates of `accounts` (lua/rate.lua): RateLimited
        when it is too early for one of them, else each rate moves on."""
        tenant = validate.tenant_id(tenant)
        named = [validate.account_id(account) for account in accounts]
        reply = await self._run("rate", [accounts_key(tenant)], [str(len(named)), *named])
        raise_for_reply(tenant, "", "rate", reply)

    async def close_idle_accounts(
        self, tenant: str, cursor: int = 0, count: int = CLOSE_SCAN
    ) -> tuple[int, int]:
        """One page of the tenant's risk-factor accounts (HSCAN from `cursor` over its
        accounts hash), each closed if it has held nothing since its window ended
        (lua/close.lua); returns the next cursor (0: the scan is over) and how many
        were closed. Policy accounts are never closed, and none while the fleet's
        release flag says an older release may serve (its scripts cannot settle a
        hold on a closed account): then the scan is over at once."""
        tenant = validate.tenant_id(tenant)
        if not self.release.reads(COUNTED_ESCALATIONS):
            return 0, 0
        with translate_redis_errors("close"):
            cursor, fields = await self.redis.hscan(
                accounts_key(tenant), cursor, match="*factor:*|ws", count=count
            )
        names = (str(name) for name in fields)
        ids = sorted(
            {
                name.rpartition("|")[0]
                for name in names
                if name.startswith(("factor:", "shadow:factor:"))
            }
        )
        closed = 0
        keys = tenant_keys(tenant)[:2]
        for start in range(0, len(ids), CLOSE_BATCH):
            chunk = ids[start : start + CLOSE_BATCH]
            reply = await self._run("close", keys, [str(len(chunk)), *chunk])
            raise_for_reply(tenant, "", "close", reply)
            closed += int(reply[1])
        return int(cursor), closed

    async def reserve_many(
        self, tenant: str, requests: Sequence[ReserveRequest]
    ) -> list[ReserveResult | LedgerError]:
        """Several reserves in one pipelined round trip, for batch callers such as the
        simulator. Each is still its own atomic script, run in order; an item that
        fails gets its error in its place, and the others are applied. The batch is
        followed by the ledger's waits, as `reserve` is: each result says what they
        acknowledged."""
        batch = [
            (request.idempotency_key, self.reserve_args(request, batched=True))
            for request in requests
        ]
        replies = await self._run_many("reserve", tenant, batch)
        archived = [i for i, (reply, _) in enumerate(replies) if _is_reply(reply, "archived")]
        for i in archived:
            await restore(self, tenant, batch[i][0])
        if archived:  # replays now, which no item of the batch can have changed
            again_replies = await self._run_many("reserve", tenant, [batch[i] for i in archived])
            for i, reply in zip(archived, again_replies, strict=True):
                replies[i] = reply
        again = [i for i, (reply, _) in enumerate(replies) if _is_reply(reply, EXPIRE_FIRST)]
        if again:
            await self._expire_due(tenant)
            retried = [
                (batch[i][0], _deciding(self.reserve_args(requests[i]), requests[i].pool))
                for i in again
            ]
            for i, reply in zip(
                again, await self._run_many("reserve", tenant, retried), strict=True
            ):
                replies[i] = reply
        return [
            _or_error(_reserve_result, tenant, request.idempotency_key, reply, acked=acked)
            for request, (reply, acked) in zip(requests, replies, strict=True)
        ]

    async def post_many(
        self,
        tenant: str,
        posts: Sequence[tuple[str, int | Mapping[str, int]]],
        *,
        outcome: str = "",
    ) -> list[TransitionResult | LedgerError]:
        """Several posts of (hold id, amount) in one pipelined round trip, with errors
        in place as in `reserve_many`; `outcome` is kept with each (as `post`'s). A post
        its waits acknowledged short is kept and reported as `post`'s is."""
        kept = validate.blob("outcome", outcome)  # once: it is every item's
        batch = [(hold_id, self._post_args(hold_id, amount, kept)) for hold_id, amount in posts]
        replies = await self._run_many("post", tenant, batch)
        results: list[TransitionResult | LedgerError] = []
        for (hold_id, _), (reply, acked) in zip(posts, replies, strict=True):
            result = _or_error(_transition_result, tenant, hold_id, "post", reply, acked=acked)
            if isinstance(result, TransitionResult):
                self._report_short("post", tenant, hold_id, acked)
            results.append(result)
        return results

    def reserve_args(self, r: ReserveRequest, *, batched: bool = False) -> list[str]:
        """reserve.lua's ARGV for `r` on this ledger (validated: BadInput names what is
        wrong), for callers that time or test the script itself. `batched`: as an item
        of `reserve_many`, which looks for due holds before any decision, admission or
        not: an item admitted beside them would take the room that an earlier item,
        sent back to expire them first, is decided on after it. From the first due hold
        on, every item comes back, and all are decided again in their order (a
        calibrating route's reserve always looks)."""
        in_order = [IN_ORDER] if batched and r.pool is None else []
        return [
            validate.identifier("idempotency_key", r.idempotency_key),
            validate.identifier("fingerprint", r.fingerprint),
            str(validate.ttl("ttl_ms", r.ttl_ms)),
            str(validate.ttl("escalation_ttl_ms", r.escalation_ttl_ms)),
            "1" if r.armed else "0",
            str(self.retention_ms),
            str(validate.amount("escalate_above", r.escalate_above)),
            validate.blob("request", r.request),
            _provenance(r.provenance, r.request),
            *validate.account_amounts(r.amounts),
            str(self.denied_retention_ms),
            *_open_args(r.amounts, r.open_missing),
            # Counted, an escalation an older release resolved would stay counted.
            "1" if self.release.reads(COUNTED_ESCALATIONS) else "0",
            "1" if r.shadow else "0",
            *_pool_args(r.pool),
            *in_order,
        ]

    async def _run_many(
        self, operation: str, tenant: str, batch: list[tuple[str, list[str]]]
    ) -> list[tuple[list[Any] | LedgerError, Acks]]:
        """One pipeline of calls, each item (hold id, args) in order (on a cluster, to
        the primary of the tenant's slot; items redirected by a slot migration are
        sent again one by one), followed by the ledger's waits: each item's reply with
        what they acknowledged (NO_ACKS when none are asked for). Items Redis answered
        with an error get a LedgerUnavailable in place."""
        tenant = validate.tenant_id(tenant)
        keys_of = reserve_keys if operation == "reserve" else hold_script_keys
        calls = [(keys_of(tenant, hold_id), args) for hold_id, args in batch]
        with translate_redis_errors(operation):
            replies = await self._scripts.call_many(operation, calls, self.waits)
        # One Acks per pipeline's waits (a failed wait is logged once, not per item);
        # an item that failed (a re-send that could not reach Redis has no waits) gets
        # its error, which carries no count.
        acks: dict[int, Acks] = {}
        out: list[tuple[list[Any] | LedgerError, Acks]] = []
        for reply, answers in replies:
            acked = NO_ACKS
            if self.waits and not isinstance(reply, Exception):
                if id(answers) not in acks:
                    acks[id(answers)] = self._acks(operation, answers)
                acked = acks[id(answers)]
            out.append((_in_place(operation, reply), acked))
        return out

    async def post(
        self, tenant: str, hold_id: str, amount: int | Mapping[str, int], *, outcome: str = ""
    ) -> TransitionResult:
        """The effect happened at `amount` (its realised residual): for every account,
        or per account. Above the hold it is an overrun: posted and flagged.
        `outcome` (the upstream's answer) is kept for repeats of the request."""
        args = self.post_args(hold_id, amount, outcome)
        return await self._transition("post", tenant, hold_id, args, replicated=True)

    def post_args(
        self, hold_id: str, amount: int | Mapping[str, int], outcome: str = ""
    ) -> list[str]:
        """post.lua's ARGV on this ledger (validated: BadInput names what is wrong), for
        callers that time or test the script itself."""
        return self._post_args(hold_id, amount, validate.blob("outcome", outcome))

    def _post_args(self, hold_id: str, amount: int | Mapping[str, int], outcome: str) -> list[str]:
        """post_args with `outcome` already validated."""
        return [*self._hold_args(hold_id), outcome, *validate.per_account(amount)]

    async def void(
        self, tenant: str, hold_id: str, *, outcome: str = "", due_only: bool = False
    ) -> TransitionResult:
        """Release the hold. `due_only`: only once its deadline has passed (Redis
        time), else HoldNotDue: what a reconciler's "not found" may void."""
        args = [*self._hold_args(hold_id), validate.blob("outcome", outcome)]
        return await self._transition("void", tenant, hold_id, [*args, "1"] if due_only else args)

    async def retry(self, tenant: str, hold_id: str, window_ms: int) -> TransitionResult:
        """Claim an ambiguous effect for sending it again: the claim and the hold's
        deadline last at least now + `window_ms` (Redis time), so no other retry sends
        it meanwhile and no `void(due_only=True)` overtakes that request. HoldInFlight
        while another retry's claim lives; HoldStateConflict if the hold is no longer
        ambiguous. Either way it must not be sent. The claim (the result's `claim`)
        ends when the hold is posted or voided, or marked ambiguous again by its
        claimer (`mark_ambiguous` with the claim), or lapses. Followed by WAIT /
        WAITAOF when asked for (the result's `replicas`, `fsynced`): a claim
        acknowledged short must not be sent either, as a failover could lose the
        hold's charge (its reserve was written before the claim, which the wait counts)."""
        args = [validate.identifier("hold_id", hold_id), str(validate.amount("window", window_ms))]
        return await self._transition("retry", tenant, hold_id, args, replicated=True)

    async def mark_ambiguous(
        self, tenant: str, hold_id: str, reason: str, claim: str = ""
    ) -> TransitionResult:
        """The effect may have happened: charged until post or void. `claim`: the
        caller's retry claim (`retry`), which ends with this; a hold already ambiguous
        keeps any other claim (only its claimer, or its lapse, ends it)."""
        args = [validate.identifier("hold_id", hold_id), validate.identifier("reason", reason)]
        if claim:
            args.append(validate.identifier("claim", claim))
        return await self._transition("ambiguous", tenant, hold_id, args)

    async def compensate(
        self, tenant: str, hold_id: str, recovered: int | Mapping[str, int]
    ) -> TransitionResult:
        args = [*self._hold_args(hold_id), *validate.per_account(recovered)]
        return await self._transition("compensate", tenant, hold_id, args)

    async def true_up(self, tenant: str, hold_id: str, realised: int) -> TransitionResult:
        """A posted effect's realised residual: the hold's net charge (posted minus
        compensated) becomes `realised` on every account; above what the hold held
        it is an overrun, posted and flagged. 'exists' if it already was."""
        args = [*self._hold_args(hold_id), str(validate.amount("realised", realised))]
        return await self._transition("trueup", tenant, hold_id, args, replicated=True)

    async def learn(self, tenant: str, hold_id: str, route_id: str, failed: bool) -> bool:
        """Count a posted hold's compensation outcome for its route's learned prices,
        once per hold: False if this hold's outcome was counted already."""
        outcome = "failures" if failed else "successes"
        tenant = validate.tenant_id(tenant)
        args = [validate.identifier("hold_id", hold_id), route_id, outcome]
        keys = [*hold_script_keys(tenant, hold_id), observed_key(tenant, outcome)]
        reply, _ = await self._on_hold("learn", tenant, hold_id, keys, args)
        counted = raise_for_reply(tenant, hold_id, "learn", reply) is Status.OK
        if counted:
            # Gateways re-read the counts when this moves (PolicyStore.epochs).
            await self.policies.bump_outcomes()
        return counted

    async def calibrate(
        self, tenant: str, hold_id: str, route_id: str, factor_ppm: int, keep: int
    ) -> bool:
        """Record a posted hold's realised residual factor (ppm) for its route's
        self-calibrating price, once per hold: False if it was recorded already."""
        tenant = validate.tenant_id(tenant)
        args = [validate.identifier("hold_id", hold_id), route_id, str(factor_ppm), str(keep)]
        keys = [*hold_script_keys(tenant, hold_id), factors_key(tenant)]
        reply, _ = await self._on_hold("calibrate", tenant, hold_id, keys, args)
        recorded = raise_for_reply(tenant, hold_id, "calibrate", reply) is Status.OK
        if recorded:
            # Gateways re-read settled factors with the counts when this moves: a look
            # between `learn`'s bump and this write sees the next bump.
            await self.policies.bump_outcomes()
        return recorded

    async def approve(
        self, tenant: str, hold_id: str, approver: str, *, ttl_ms: int, note: str = ""
    ) -> Approval:
        """Consume-once: raises HoldStateConflict naming the outcome for every loser.
        The winner gets the hold's new deadline and its kept request. `note` (the
        approver's why) is kept with the hold and journaled."""
        args = [
            *self._hold_args(hold_id),
            str(validate.ttl("ttl_ms", ttl_ms)),
            validate.identifier("approver", approver),
            validate.note(note),
        ]
        keys = hold_script_keys(validate.tenant_id(tenant), hold_id)
        reply, acked = await self._on_hold("approve", tenant, hold_id, keys, args)
        status = raise_for_reply(tenant, hold_id, "approve", reply)
        state, by, deadline_ms, request = reply[1:5]
        return Approval(
            status,
            hold_id,
            HoldState(state),
            str(by),
            int(deadline_ms),
            str(request),
            acked.replicas,
            acked.fsynced,
        )

    async def reject(
        self, tenant: str, hold_id: str, approver: str, *, note: str = ""
    ) -> TransitionResult:
        args = [
            *self._hold_args(hold_id),
            validate.identifier("approver", approver),
            validate.note(note),
        ]
        return await self._transition("reject", tenant, hold_id, args)

    async def note_resolution(
        self, tenant: str, hold_id: str, state: HoldState, admin: str, note: str
    ) -> TransitionResult:
        """Journal who resolved an ambiguous hold by hand (after posting or voiding
        it) and why, once per hold: 'exists' if it was journaled before (`by` says
        by whom)."""
        args = [
            validate.identifier("hold_id", hold_id),
            state.value,
            validate.identifier("admin", admin),
            validate.note(note),
        ]
        return await self._transition("note", tenant, hold_id, args)

    # Webhook delivery

    async def webhook_lease(
        self, tenant: str, owner: str, action: str, arg: str = ""
    ) -> tuple[bool, str]:
        """webhook.lua: 'hold' (take or renew for `arg` ms; returns the cursor),
        'advance' (move the cursor to entry `arg`) or 'release', each only by the
        lease's holder. (False, holder) when the lease is someone else's."""
        tenant = validate.tenant_id(tenant)
        keys = [
            *tenant_keys(tenant)[:2],
            webhook_lease_key(tenant),
            webhook_cursor_key(tenant),
        ]
        args = [action, validate.identifier("owner", owner)] + ([arg] if arg else [])
        reply = await self._run("webhook", keys, args)
        if reply[0] == Status.CONFLICT:
            return False, str(reply[1])
        if reply[0] == Status.BAD_INPUT:
            raise BadInput(str(reply[1]), str(reply[2]))
        return True, str(reply[1])

    # Rules

    async def set_rule(
        self,
        tenant: str,
        rule_id: str,
        admin: str,
        spec: str,
        ttl_ms: int,
        raise_limit: tuple[str, int] | None = None,
    ) -> int:
        """Set a bounded-time rule, live for `ttl_ms` from now (Redis's clock); returns
        its expiry. Journaled. `raise_limit` (account, amount): while the rule lives,
        the account's limit and soft limit are that much higher in every reserve;
        UnknownAccount if the account does not exist."""
        tenant = validate.tenant_id(tenant)
        keys = [*tenant_keys(tenant)[:2], rules_key(tenant)]
        args = [
            "set",
            validate.identifier("rule", rule_id),
            validate.identifier("admin", admin),
            spec,
            str(validate.ttl("ttl_ms", ttl_ms)),
        ]
        if raise_limit is not None:
            account, amount = raise_limit
            args += [validate.account_id(account), str(validate.amount("amount", amount))]
        reply = await self._run("rule", keys, args)
        raise_for_reply(tenant, "", "rule", reply)
        return int(reply[1])

    async def delete_rule(self, tenant: str, rule_id: str, admin: str) -> bool:
        """Delete a live rule (journaled); False if there is none by that id."""
        tenant = validate.tenant_id(tenant)
        keys = [*tenant_keys(tenant)[:2], rules_key(tenant)]
        args = ["delete", validate.identifier("rule", rule_id), validate.identifier("admin", admin)]
        reply = await self._run("rule", keys, args)
        if reply[0] == Status.NOT_FOUND:
            return False
        raise_for_reply(tenant, "", "rule", reply)
        return True

    async def rules(self, tenant: str, now_ms: int) -> list[Rule]:
        """The tenant's rules live at `now_ms` (Redis's clock), by id."""
        with translate_redis_errors("rules"):
            stored = await _decoded(self.redis.hgetall(rules_key(validate.tenant_id(tenant))))
        out = []
        for name, spec in stored.items():
            until = stored.get(f"{name}|until")
            if "|" not in name and until is not None and int(until) > now_ms:
                out.append(Rule(name, spec, int(until)))
        return sorted(out, key=lambda rule: rule.rule_id)

    async def expire(self, tenant: str, hold_id: str) -> TransitionResult:
        return await self._transition("expire", tenant, hold_id, self._hold_args(hold_id))

    async def _expire_due(self, tenant: str) -> None:
        """What a reserve does before deciding while holds of the tenant are due (it
        cannot expire them itself: their keys are not declared in it)."""
        for _ in range(MAX_SWEEPS_BEFORE_RESERVE):
            swept = await self.sweep(tenant, SWEEP_BATCH)
            if not swept.remaining_due or not swept.visited:
                return

    async def sweep(self, tenant: str, batch: int = 100) -> SweepResult:
        """Expire up to `batch` due holds. One call when none is due; else a second,
        which declares the keys of the due holds the first one named."""
        tenant = validate.tenant_id(tenant)
        if not 1 <= batch <= 1000:
            raise BadInput("batch", "must be an integer in [1, 1000]")
        retention = str(self.retention_ms)
        reply = await self._run("sweep", tenant_keys(tenant), [retention, str(batch), "0"])
        raise_for_reply(tenant, "", "sweep", reply)
        due = [str(hold_id) for hold_id in reply[3:]]
        if due:
            held = (key for hold_id in due for key in hold_keys(tenant, hold_id))
            keys = [*tenant_keys(tenant), *held]
            reply = await self._run("sweep", keys, [retention, str(batch), str(len(due)), *due])
            raise_for_reply(tenant, "", "sweep", reply)
        return SweepResult(visited=int(reply[1]), remaining_due=int(reply[2]))

    async def hold(self, tenant: str, hold_id: str) -> Hold | None:
        record, kept = hold_keys(
            validate.tenant_id(tenant), validate.identifier("hold_id", hold_id)
        )
        # Two keys, read without a transaction (a cluster pipeline has none): a
        # settlement between the reads would pair a live record with its outcome.
        # One changes the state, so a read whose state held across it is consistent.
        for _ in range(HOLD_READS):
            with translate_redis_errors("hold"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hgetall(record)
                    pipe.get(kept)
                    pipe.hget(record, "st")
                    fields, payload, state = await pipe.execute()
            if not fields:
                archived = await read_archived(self, validate.tenant_id(tenant), hold_id)
                return None if archived is None else _hold(hold_id, *archived)
            if state == fields["st"]:
                return _hold(hold_id, fields, payload)
        # Moved on under every read: the record, without its payload.
        return _hold(hold_id, fields, "")

    async def hold_ids(self, tenant: str, state: HoldState) -> list[str]:
        """Ids of the tenant's holds in `state`: indexed for the live states the
        reconciler and the approval queue need, a SCAN for settled ones, which finds
        those still in the tenant's slot (not those archived: ledger/archive.py)."""
        tenant = validate.tenant_id(tenant)
        with translate_redis_errors("hold_ids"):
            if state is HoldState.AMBIGUOUS:
                return sorted(await _decoded(self.redis.smembers(ambiguous_key(tenant))))
            if state is HoldState.ESCALATED:
                return sorted(await _decoded(self.redis.smembers(escalated_key(tenant))))
            if state is HoldState.PENDING:
                candidates = await _decoded(self.redis.zrange(deadlines_key(tenant), 0, -1))
            else:
                start = hold_key(tenant, "")
                scan = self.redis.scan_iter(f"{_glob(start)}*", count=500)
                candidates = [str(k)[len(start) :] async for k in scan]
            result = []
            for hold_id in candidates:
                found = await self.redis.hget(hold_key(tenant, hold_id), "st")
                if found == state.value:
                    result.append(hold_id)
        return sorted(result)

    async def escalation_order(self, tenant: str) -> list[tuple[int, str]]:
        """(created at, hold id) of every escalated hold, oldest first: one small
        field per hold, in one round trip, so that a page of the approval queue reads
        only its own holds' records (and their kept requests)."""
        tenant = validate.tenant_id(tenant)
        ids = await self.hold_ids(tenant, HoldState.ESCALATED)
        with translate_redis_errors("escalation_order"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for hold_id in ids:
                    pipe.hget(hold_key(tenant, hold_id), "t0")
                created = await pipe.execute()
        # A record gone since the set was read: no longer waiting.
        return sorted((int(t0), h) for t0, h in zip(created, ids, strict=True) if t0 is not None)

    async def live_counts(self, tenant: str) -> dict[str, int]:
        """How many holds of the tenant are pending, escalated and ambiguous."""
        tenant = validate.tenant_id(tenant)
        with translate_redis_errors("live_counts"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(deadlines_key(tenant))
                pipe.scard(escalated_key(tenant))
                pipe.scard(ambiguous_key(tenant))
                live, escalated, ambiguous = await pipe.execute()
        return {"pending": live - escalated, "escalated": escalated, "ambiguous": ambiguous}

    async def holds(self, tenant: str, hold_ids: Sequence[str]) -> dict[str, Hold]:
        """The holds of `hold_ids` that exist, by id in the order asked, as `hold`
        reads each, in one pipelined round trip (every key is the tenant's, in one
        slot: one node of a cluster): a page of the approval queue costs one round
        trip, not one per hold. A hold whose state moved between its reads (a
        settlement may pair a live record with its outcome) is read again on its own."""
        tenant = validate.tenant_id(tenant)
        keys = [hold_keys(tenant, validate.identifier("hold_id", h)) for h in hold_ids]
        with translate_redis_errors("holds"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for hold_id, (record, kept) in zip(hold_ids, keys, strict=True):
                    pipe.hgetall(record)
                    pipe.get(kept)
                    pipe.hget(record, "st")
                    pipe.hexists(settled_key(tenant), hold_id)
                replies = await pipe.execute()
        found: dict[str, Hold] = {}
        for at, hold_id in enumerate(hold_ids):
            fields, payload, state, archived = replies[4 * at : 4 * at + 4]
            if not fields:
                # Gone, or archived out of the slot: then read from its copy.
                copy = await read_archived(self, tenant, hold_id) if archived else None
                if copy is not None:
                    found[hold_id] = _hold(hold_id, *copy)
                continue
            if state == fields["st"]:
                found[hold_id] = _hold(hold_id, fields, payload)
            elif (moved := await self.hold(tenant, hold_id)) is not None:
                found[hold_id] = moved
        return found

    async def policy_versions(
        self, accounts: Mapping[str, Sequence[str]]
    ) -> dict[str, dict[str, int]]:
        """tenant -> account -> the policy version its limits were written from (0:
        unversioned), for the `accounts` named per tenant that exist, in one round
        trip: what a host compares with the version it serves before writing limits."""
        tenants = [validate.tenant_id(tenant) for tenant in accounts]
        with translate_redis_errors("policy_versions"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    for account in accounts[tenant]:
                        pipe.hmget(accounts_key(tenant), [f"{account}|limit", f"{account}|pv"])
                replies = iter(await pipe.execute())
        found: dict[str, dict[str, int]] = {}
        for tenant in tenants:
            mine = found.setdefault(tenant, {})
            for account in accounts[tenant]:
                limit, version = next(replies)
                if limit is not None:
                    mine[account] = int(version or 0)
        return found

    async def snapshot(
        self, accounts: Mapping[str, Sequence[str]], *, holds: bool = True
    ) -> list[TenantSnapshot]:
        """Each tenant's TenantSnapshot, for the `accounts` named per tenant, in three
        round trips for all of them (the clock, then two pipelines): the cost grows
        with the accounts named and the escalated and ambiguous holds, never with
        settled holds (for /metrics, read at scrape time). `holds=False`: the live
        counts only, in two round trips and four commands per tenant however many
        holds wait (`escalated` and `ambiguous` are empty): what anyone may scrape
        must not cost a read per hold an agent can make."""
        tenants = [validate.tenant_id(tenant) for tenant in accounts]
        # Not in the pipeline: a cluster pipeline refuses keyless commands such as TIME.
        now_ms = await self.now_ms()
        with translate_redis_errors("snapshot"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.zcard(deadlines_key(tenant))
                    if holds:
                        pipe.smembers(escalated_key(tenant))
                        pipe.smembers(ambiguous_key(tenant))
                    else:
                        pipe.scard(escalated_key(tenant))
                        pipe.scard(ambiguous_key(tenant))
                    for account in accounts[tenant]:
                        pipe.hmget(accounts_key(tenant), account_fields(account))
                replies = iter(await pipe.execute())
        read = []
        counted = []
        for tenant in tenants:
            live, escalated, ambiguous = next(replies), next(replies), next(replies)
            balances = [
                _balance(account, values)
                for account, values in zip(accounts[tenant], replies, strict=False)
                if values[0] is not None
            ]
            if holds:
                read.append((tenant, live, sorted(escalated), sorted(ambiguous), balances))
            else:
                counts = {
                    "pending": live - escalated,
                    "escalated": escalated,
                    "ambiguous": ambiguous,
                }
                counted.append(TenantSnapshot(tenant, now_ms, counts, balances, [], []))
        if not holds:
            return counted
        with translate_redis_errors("snapshot"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant, _, escalated, ambiguous, _ in read:
                    for hold_id in escalated + ambiguous:
                        pipe.hmget(hold_key(tenant, hold_id), ("t0", "dl"))
                times = iter(await pipe.execute())
        snapshots = []
        for tenant, live, escalated, ambiguous, balances in read:
            queued = [next(times) for _ in escalated]
            doubtful = [next(times) for _ in ambiguous]
            counts = {
                "pending": live - len(escalated),
                "escalated": len(escalated),
                "ambiguous": len(ambiguous),
            }
            snapshots.append(
                TenantSnapshot(
                    tenant,
                    now_ms,
                    counts,
                    balances,
                    [(int(t0), int(dl)) for t0, dl in queued if t0 is not None],
                    [int(t0) for t0, _ in doubtful if t0 is not None],
                )
            )
        return snapshots

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
        keys = self._hold_keys(tenant, hold_id)
        if replicated:
            reply, acked = await self._on_hold(operation, tenant, hold_id, keys, args)
            result = _transition_result(tenant, hold_id, operation, reply, acked)
            if operation != "retry":  # a short retry claim is refused: nothing to lose
                self._report_short(operation, tenant, hold_id, acked)
            return result
        reply, _ = await self._on_hold(operation, tenant, hold_id, keys, args, replicated=False)
        return _transition_result(tenant, hold_id, operation, reply)

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
        return reply, acked


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


async def _decoded(reply: Awaitable[Any]) -> Any:
    """A reply of the ledger's client, whose strings arrive decoded (decode_responses):
    redis-py types them as bytes | str."""
    return await reply


def _in_place(operation: str, reply: Any) -> Any:
    """A batch item's reply, or the LedgerUnavailable its Redis error stands for."""
    if not isinstance(reply, redis_errors.RedisError):
        return reply
    try:
        with translate_redis_errors(operation):
            raise reply
    except LedgerUnavailable as exc:
        return exc


def _is_reply(reply: Any, status: str) -> bool:
    return isinstance(reply, list) and bool(reply) and reply[0] == status


def _or_error(parse: Callable[..., T], *args: Any, acked: Acks) -> T | LedgerError:
    """`parse(*args, acked)`, whose last argument is a reply; an error in its place (or
    one the reply stands for) is returned, not raised."""
    if isinstance(args[-1], LedgerError):
        return args[-1]
    try:
        return parse(*args, acked)
    except LedgerError as exc:
        return exc


# Reads of the open holds `repair_pools` makes before it gives up on a busy tenant.
REPAIR_TRIES = 5

_POOL_TAG = re.compile(r"[A-Za-z0-9]{1,32}")


def _pool_args(pool: PoolTicket | None) -> list[str]:
    """reserve.lua's ARGV[14+2n+5m..]: for a calibrating route, '0' (do not decide
    while holds are due) then its tag, the face value, the pending its price
    assumed and its price alone (0: the amounts, only for a price alone, pending 1);
    nothing for any other route (its arguments are as before)."""
    if pool is None:
        return []
    if not _POOL_TAG.fullmatch(pool.tag):
        raise BadInput("route_tag", "must be 1-32 letters and digits (ledger.pool_tag)")
    pending = pool.pending
    if not (math.isfinite(pending) and pending >= 1):
        raise BadInput("pending", f"{pending!r} must be a finite number >= 1")
    if pending > 1 and pool.alone is None:
        # The thresholds compare the price alone: a pooled one is lowered by the holds
        # an agent opens itself.
        raise BadInput(
            "alone_price",
            f"a reserve priced for {pending!r} open holds must give its price alone "
            "(PoolTicket.alone), which the approval thresholds compare",
        )
    face = validate.amount("face_value", pool.face_value)
    alone = validate.amount("alone_price", pool.alone if pool.alone is not None else 0)
    return ["0", pool.tag, str(face), repr(float(pending)), str(alone)]


def _deciding(args: list[str], pool: PoolTicket | None) -> list[str]:
    """`args` that decide even while holds are due (after an `expire_first`)."""
    if pool is None:
        return [*args, DECIDE_ANYWAY]
    return [*args[:-5], DECIDE_ANYWAY, *args[-4:]]


def _reserve_result(
    tenant: str, hold_id: str, reply: list[Any], acked: Acks = NO_ACKS
) -> ReserveResult:
    status = _OK_STATUSES.get(reply[0]) or raise_for_reply(tenant, hold_id, "reserve", reply)
    end = 7 + 4 * int(reply[6])
    checks = tuple(
        AccountCheck(reply[i], int(reply[i + 1]), int(reply[i + 2]), int(reply[i + 3]))
        for i in range(7, end, 4)
    )
    return ReserveResult(
        status=status,
        hold_id=hold_id,
        decision=_DECISIONS[reply[1]],
        reason=_REASONS[reply[2]],
        state=_STATES[reply[3]],
        deadline_ms=int(reply[4]),
        created_ms=int(reply[5]),
        accounts=checks,
        replicas=acked.replicas,
        fsynced=acked.fsynced,
        pool=open_pool(reply, end) if len(reply) > end else None,
    )


def _transition_result(
    tenant: str, hold_id: str, operation: str, reply: list[Any], acked: Acks = NO_ACKS
) -> TransitionResult:
    status = _OK_STATUSES.get(reply[0]) or raise_for_reply(tenant, hold_id, operation, reply)
    flags = str(reply[2])
    if operation == "retry":  # its third field is the claim, not flags
        return TransitionResult(
            status,
            hold_id,
            HoldState(reply[1]),
            _NO_FLAGS,
            replicas=acked.replicas,
            claim=flags,
            fsynced=acked.fsynced,
        )
    return TransitionResult(
        status=status,
        hold_id=hold_id,
        state=_STATES[reply[1]],
        flags=frozenset(flags.split(",")) - {""} if flags else _NO_FLAGS,
        by=flags if operation in ("reject", "note") else "",
        replicas=acked.replicas,
        fsynced=acked.fsynced,
    )


# Replies parsed by lookup: an enum's constructor costs more than the script's
# answer is worth on the hot path.
_OK_STATUSES = {Status.OK.value: Status.OK, Status.EXISTS.value: Status.EXISTS}
_DECISIONS = {d.value: d for d in Decision}
_REASONS = {r.value: r for r in Reason}
_STATES = {s.value: s for s in HoldState}
_NO_FLAGS: frozenset[str] = frozenset()
# The states whose payload is the outcome (settle_fields in lua/_lib.lua).
_SETTLED_WITH_OUTCOME = frozenset({HoldState.POSTED.value, HoldState.VOIDED.value})


def _provenance(provenance: Provenance | None, request: str) -> str:
    """The reserve's `prov` argument: Provenance.packed, with the request's digest."""
    if provenance is None:
        return ""
    texts = (provenance.route, provenance.agent, provenance.principal, provenance.agent_key)
    if not all(isinstance(text, str) for text in texts):
        raise BadInput("provenance", "route, agent, principal and agent_key must be text")
    face = validate.amount("provenance.face_value", provenance.face_value)
    digest = hashlib.sha256(request.encode()).hexdigest() if request else ""
    packed = replace(provenance, face_value=face, request_sha256=digest).packed()
    if len(packed.encode()) > MAX_PROVENANCE_BYTES:
        raise BadInput("provenance", f"must pack into at most {MAX_PROVENANCE_BYTES} bytes")
    return packed


def _open_args(amounts: Mapping[str, int], specs: Sequence[AccountSpec]) -> list[str]:
    """The reserve's `m, (account, limit, soft, window_ms, approval) * m` tail."""
    named = [spec.account for spec in specs]
    if len(set(named)) != len(named) or not set(named) <= set(amounts):
        raise BadInput("open_missing", "must name accounts of the hold, each once")
    return [str(len(specs)), *(arg for spec in specs for arg in validate.account_args(spec))]


def _glob(text: str) -> str:
    """Escape glob metacharacters (the hash tag's braces are literal in a pattern)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _balance(account: str, values: list[str | None]) -> Balance:
    """An account from its ACCOUNT_FIELDS, in that order."""
    try:
        limit, soft, win, appr, pend, post, ws, over = (int(v or "") for v in values)
    except ValueError as exc:
        raise LedgerUnavailable(
            "reading an account",
            RedisFailure.WRONG_TYPE,
            f"account {account} holds {values!r}, not eight integers",
        ) from exc
    return Balance(
        account=account,
        limit=limit,
        soft_limit=soft,
        pending=pend,
        posted=post,
        window_ms=win,
        window_start_ms=ws,
        approval_threshold=appr,
        overruns=over,
    )


def _numbers(accounts: list[str], text: str | None) -> dict[str, int]:
    if not text:
        return {}
    return dict(zip(accounts, (int(x) for x in text.split(",")), strict=True))


def _hold(hold_id: str, f: dict[str, str], payload: str | None) -> Hold:
    """A hold from its record and its payload (payload_key: the request, or the
    outcome once posted or voided, unless the record has it in parts o1, o2, ...).
    A hold written by an older irrev, sharing the Redis during an upgrade, kept both
    in its record (req, out), or its outcome only in the payload."""
    accounts = f["acc"].split(",") if f.get("acc") else []
    settled = f["st"] in _SETTLED_WITH_OUTCOME
    request = f.get("req", "") if payload is None or settled else payload
    outcome = f.get("out", "") if payload is None or not settled else payload
    if "o1" in f:  # kept in the record, in parts (settle_fields in lua/_lib.lua)
        outcome = "".join(takewhile(bool, (f.get(f"o{n}", "") for n in count(1))))
    reason = f["why"]
    posted = _numbers(accounts, f.get("pst"))
    # A posted hold without `cmp` has recovered nothing yet.
    compensated = _numbers(accounts, f.get("cmp")) or dict.fromkeys(posted, 0)
    return Hold(
        hold_id=hold_id,
        state=HoldState(f["st"]),
        decision=DECIDED_BY[Reason(reason)],
        reason=Reason(reason),
        fingerprint=f["fp"],
        armed=f.get("arm") == "1",
        created_ms=int(f["t0"]),
        deadline_ms=int(f["dl"]),
        amounts=_numbers(accounts, f.get("amt")),
        posted=posted,
        compensated=compensated,
        flags=frozenset(f.get("flag", "").split(",")) - {""},
        ambiguity=f.get("amb", ""),
        request=request,
        outcome=outcome,
        by=f.get("by", ""),
        limits=_numbers(accounts, f.get("lim")),
        used=_numbers(accounts, f.get("used")),
        note=f.get("note", ""),
        resolved_by=f.get("rby", ""),
        resolution_note=f.get("rnote", ""),
    )
