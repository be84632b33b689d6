"""Typed ledger errors. Business outcomes (deny, escalate, a replay) are results, not
errors; these are for calls that cannot be carried out, and for the transport."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from redis import exceptions as redis_errors

from .records import HoldState, OpenPool, Status


class LedgerError(Exception):
    """Base of every ledger error."""


class BadInput(LedgerError, ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownAccount(LedgerError):
    def __init__(self, tenant: str, account: str) -> None:
        super().__init__(
            f"account {account!r} of tenant {tenant!r} does not exist: create it first"
        )
        self.tenant = tenant
        self.account = account


class HoldNotFound(LedgerError):
    def __init__(self, tenant: str, hold_id: str) -> None:
        super().__init__(f"hold {hold_id!r} of tenant {tenant!r} does not exist")
        self.tenant = tenant
        self.hold_id = hold_id


class IdempotencyConflict(LedgerError):
    """The key was used before for a different request (or a different amount)."""

    def __init__(self, hold_id: str, state: HoldState, detail: str) -> None:
        super().__init__(
            f"idempotency key {hold_id!r} was already used for {detail} (hold is {state}); "
            "use a new key for a new request"
        )
        self.hold_id = hold_id
        self.state = state


class HoldStateConflict(LedgerError):
    """The hold is not in a state that allows the operation: someone else resolved it,
    or it settled. `state` names the outcome; `by` who resolved it, where recorded."""

    def __init__(self, hold_id: str, operation: str, state: HoldState, by: str = "") -> None:
        who = f" by {by}" if by else ""
        super().__init__(f"cannot {operation} hold {hold_id!r}: it is already {state}{who}")
        self.hold_id = hold_id
        self.operation = operation
        self.state = state
        self.by = by


class KeyNotFound(LedgerError):
    def __init__(self, tenant: str, key_id: str) -> None:
        super().__init__(f"tenant {tenant!r} has no key {key_id!r}; list its keys to find the id")
        self.tenant = tenant
        self.key_id = key_id


class KeyNotLive(LedgerError):
    """A managed key that can no longer be rotated: `state` is 'revoked' (for good) or
    'expired'."""

    def __init__(self, key_id: str, state: str) -> None:
        super().__init__(f"key {key_id!r} is {state}: create a new key instead")
        self.key_id = key_id
        self.state = state


class PoolShrank(LedgerError):
    """A calibrating route's reserve was priced for more holds pending at once than
    are open (reserve.lua's `reprice`): nothing was written; price it for `pool` (one
    more hold of its face value) and reserve again. `alone`: price it for itself
    alone instead, whatever the set: priced for a pool, it would escalate, and an
    escalated hold waits outside the set (it joins the set open when it is approved,
    which may be smaller)."""

    def __init__(self, hold_id: str, pool: OpenPool, alone: bool = False) -> None:
        why = (
            "priced for a pool, it would escalate: price it alone"
            if alone
            else f"its route has {pool.count} holds open, fewer than its price assumed; "
            "price it again for them"
        )
        super().__init__(f"hold {hold_id}: {why} and reserve again")
        self.hold_id = hold_id
        self.pool = pool
        self.alone = alone


class HoldNotDue(LedgerError):
    def __init__(self, hold_id: str) -> None:
        super().__init__(f"hold {hold_id!r} has not reached its deadline")
        self.hold_id = hold_id


class RateLimited(LedgerError):
    """Too early for `account`'s rate (reserve.lua for effects, rate.lua for reads):
    nothing was written; ask again in `wait_ms`."""

    def __init__(self, account: str, wait_ms: int) -> None:
        super().__init__(f"{account} is at its rate; ask again in {wait_ms} ms")
        self.account = account
        self.wait_ms = wait_ms


class TenantEscrowed(LedgerError):
    """A plain define, or a reserve's opening of an account, on a tenant split over
    escrow shards or on one of its shards (_lib.lua's `escrowed`): nothing was
    written. Its limits are the escrow's (ledger/escrow.py), which only the escrow's
    own scripts change; an account defined beside them would hold budget no audit
    counts."""

    def __init__(self, tenant: str) -> None:
        super().__init__(
            f"tenant {tenant!r} is split over escrow shards, or is one: define its "
            "accounts with Escrow.define and reserve through Escrow.reserve"
        )
        self.tenant = tenant


class ShortOfRoom(LedgerError):
    """An escrow shard's reserve that its slices cannot hold (reserve.lua's `short`):
    nothing was written; `lacks` says, per account, how much more room it needs
    (0 where it has enough), for the caller to lease it (ledger/escrow.py) and ask
    again."""

    def __init__(self, hold_id: str, reason: str, lacks: dict[str, int]) -> None:
        named = ", ".join(f"{account} by {amount}" for account, amount in lacks.items() if amount)
        super().__init__(f"hold {hold_id!r} does not fit this shard's slices: short of {named}")
        self.hold_id = hold_id
        # What the shard would answer: budget_exceeded or over_limit (`lacks` against
        # the limits), soft_band (against the soft limits).
        self.reason = reason
        self.lacks = lacks


class HoldInFlight(LedgerError):
    """Another retry of this ambiguous hold holds its claim (retry.lua) and may be
    sending the effect right now: do not send it too. The claim lapses within
    `retry_after_ms` unless its send settles the hold or ends ambiguous first."""

    def __init__(self, hold_id: str, retry_after_ms: int) -> None:
        super().__init__(
            f"hold {hold_id!r} is being sent again by another retry; "
            f"ask again in {retry_after_ms} ms with the same key"
        )
        self.hold_id = hold_id
        self.retry_after_ms = retry_after_ms


class CheckpointMoved(LedgerError):
    """Another trim of the same tenant ran at the same time; nothing was trimmed."""


class RedisFailure(StrEnum):
    """Why Redis did not carry out a call. Each cause needs a different remedy, so the
    message keeps it: a stopped server, a replica, a cluster node and a damaged key
    are not all "unreachable"."""

    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    POOL_EXHAUSTED = "pool_exhausted"
    AUTHENTICATION = "authentication"
    NO_PERMISSION = "no_permission"
    LOADING = "loading"
    READ_ONLY = "read_only"
    CLUSTER_REDIRECT = "cluster_redirect"
    CLUSTER_DOWN = "cluster_down"
    MIGRATING = "migrating"
    CLUSTER_CLIENT = "cluster_client"
    CROSS_SLOT = "cross_slot"
    NO_SCRIPT = "no_script"
    WRONG_TYPE = "wrong_type"
    OUT_OF_MEMORY = "out_of_memory"
    BUSY = "busy"
    ENCODING = "encoding"
    REFUSED = "refused"
    NOT_REPLICATED = "not_replicated"
    NOT_FSYNCED = "not_fsynced"
    NOT_DURABLE = "not_durable"
    NO_WAITAOF = "no_waitaof"


# What happened, and what to do about it.
_EXPLAINED: dict[RedisFailure, tuple[str, str]] = {
    RedisFailure.UNREACHABLE: (
        "cannot reach Redis",
        "check that redis-server is running at the ledger's URL (IRREV_REDIS_URL)",
    ),
    RedisFailure.TIMEOUT: (
        "Redis did not answer in time",
        "check that redis-server is running and not overloaded, and the network to it",
    ),
    RedisFailure.POOL_EXHAUSTED: (
        "every connection to Redis stayed busy",
        "raise max_connections, or send fewer concurrent requests",
    ),
    RedisFailure.AUTHENTICATION: (
        "Redis refused the credentials",
        "check the user and password in the ledger's URL (IRREV_REDIS_URL)",
    ),
    RedisFailure.NO_PERMISSION: (
        "the Redis user may not run a command the ledger needs",
        "grant it the commands and irrev:* keys in the server's ACL",
    ),
    RedisFailure.LOADING: (
        "Redis is still loading its data set",
        "retry once it has loaded",
    ),
    RedisFailure.READ_ONLY: (
        "Redis refused a write: the server is a read-only replica",
        "point the ledger's URL (IRREV_REDIS_URL) at the primary",
    ),
    RedisFailure.CLUSTER_REDIRECT: (
        "Redis redirected the call to another cluster node (MOVED/ASK)",
        "the URL names a Redis Cluster node, which a single-server client cannot follow: "
        "connect with a cluster client, or to a standalone Redis",
    ),
    RedisFailure.CLUSTER_DOWN: (
        "the Redis Cluster cannot serve the call (down, or a slot without a primary)",
        "retry once the cluster has recovered",
    ),
    RedisFailure.MIGRATING: (
        "the tenant's Redis Cluster slot is moving to another node, and the move outlasted "
        "the ledger's wait (IRREV_MIGRATION_WAIT_S)",
        "retry once the migration has ended; a slot holding only live holds moves in about "
        "a second (IRREV_ARCHIVE_AFTER_S, docs/operations.md)",
    ),
    RedisFailure.CLUSTER_CLIENT: (
        "the Redis Cluster client refused the call before sending it",
        "this is a ledger bug (a call the cluster client cannot route or pipeline): report it",
    ),
    RedisFailure.CROSS_SLOT: (
        "Redis refused a call whose keys live in different cluster slots",
        "this is a ledger bug (every key of a call carries one tenant's hash tag): report it",
    ),
    RedisFailure.NO_SCRIPT: (
        "Redis no longer has a ledger script (restarted, or SCRIPT FLUSH)",
        "retry: the ledger loads its scripts again when it finds them missing",
    ),
    RedisFailure.WRONG_TYPE: (
        "a ledger key holds the wrong kind of value",
        "something other than irrev wrote to the irrev:* keys: find it, and check the "
        "ledger with `irrev ledger audit`",
    ),
    RedisFailure.OUT_OF_MEMORY: (
        "Redis is out of memory (maxmemory)",
        "raise maxmemory, or archive old journal entries with `irrev ledger trim`",
    ),
    RedisFailure.BUSY: (
        "Redis is busy running a long script",
        "retry in a moment",
    ),
    RedisFailure.ENCODING: (
        "the client could not encode the call for Redis",
        "this is a ledger bug (arguments are validated before they are sent): report it",
    ),
    RedisFailure.REFUSED: (
        "Redis refused the call",
        "see Redis's message for why",
    ),
    RedisFailure.NOT_REPLICATED: (
        "too few replicas acknowledged a write",
        "bring the replicas back (IRREV_WAIT_REPLICAS says how many must acknowledge)",
    ),
    RedisFailure.NOT_FSYNCED: (
        "the primary did not fsync a write to its append-only file in time",
        "check the server's disk and appendfsync (always acknowledges at once, everysec "
        "within about a second: raise IRREV_WAIT_TIMEOUT_MS), or unset IRREV_WAIT_AOF",
    ),
    RedisFailure.NO_WAITAOF: (
        "Redis cannot acknowledge fsyncs as IRREV_WAIT_AOF asks",
        "run Redis 7.2+ or Valkey with appendonly yes and appendfsync always or everysec "
        "(on its replicas too for IRREV_WAIT_AOF=all), let the ledger's Redis user run "
        "WAITAOF and WAIT, or unset IRREV_WAIT_AOF",
    ),
    RedisFailure.NOT_DURABLE: (
        "Redis does not keep writes as IRREV_DURABILITY=require asks",
        "turn on appendonly with appendfsync always (or everysec), or set "
        "IRREV_WAIT_REPLICAS, or IRREV_DURABILITY=warn to run anyway",
    ),
}


class LedgerUnavailable(LedgerError):
    """Redis did not carry out a call: fail closed. `cause` names why."""

    def __init__(self, operation: str, cause: RedisFailure, detail: str = "") -> None:
        what, advice = _EXPLAINED[cause]
        said = f" ({detail})" if detail else ""
        super().__init__(f"{what} during {operation}{said}: {advice}")
        self.operation = operation
        self.cause = cause


# Checked in order, so a subclass comes before its base.
_BY_CLASS: tuple[tuple[type[Exception], RedisFailure], ...] = (
    (redis_errors.AuthenticationError, RedisFailure.AUTHENTICATION),
    (redis_errors.AuthenticationWrongNumberOfArgsError, RedisFailure.AUTHENTICATION),
    (redis_errors.BusyLoadingError, RedisFailure.LOADING),
    (redis_errors.MaxConnectionsError, RedisFailure.POOL_EXHAUSTED),
    (redis_errors.TimeoutError, RedisFailure.TIMEOUT),
    (redis_errors.NoPermissionError, RedisFailure.NO_PERMISSION),
    (redis_errors.ReadOnlyError, RedisFailure.READ_ONLY),
    (redis_errors.ClusterDownError, RedisFailure.CLUSTER_DOWN),
    (redis_errors.TryAgainError, RedisFailure.MIGRATING),
    (redis_errors.AskError, RedisFailure.CLUSTER_REDIRECT),
    (redis_errors.ClusterCrossSlotError, RedisFailure.CROSS_SLOT),
    (redis_errors.NoScriptError, RedisFailure.NO_SCRIPT),
    (redis_errors.OutOfMemoryError, RedisFailure.OUT_OF_MEMORY),
    (redis_errors.DataError, RedisFailure.ENCODING),
    (redis_errors.CrossSlotTransactionError, RedisFailure.CROSS_SLOT),
    (redis_errors.SlotNotCoveredError, RedisFailure.CLUSTER_DOWN),
)

# redis-py's cluster client raises its base RedisClusterException both for a cluster
# it cannot reach or that leaves slots unserved, and for calls it refuses to send
# (a pipelined TIME, a command without a key): only its message tells them apart.
_CLUSTER_CLIENT_MESSAGES = (
    ("cannot be connected", RedisFailure.UNREACHABLE),
    ("not covered", RedisFailure.CLUSTER_DOWN),
    ("could not agree on a valid slots cache", RedisFailure.CLUSTER_DOWN),
)

# The codes redis-py maps to no class, or cannot see: a script's error carries the
# code of the command that failed inside it first (Redis 7), or after the script's
# location (Redis 6.2: "Error running script ...: @user_script: 143: -READONLY ...").
_CODES = {
    "WRONGTYPE": RedisFailure.WRONG_TYPE,
    "BUSY": RedisFailure.BUSY,
    "OOM": RedisFailure.OUT_OF_MEMORY,
    "READONLY": RedisFailure.READ_ONLY,
    "NOSCRIPT": RedisFailure.NO_SCRIPT,
    "NOPERM": RedisFailure.NO_PERMISSION,
    "MOVED": RedisFailure.CLUSTER_REDIRECT,
    "ASK": RedisFailure.CLUSTER_REDIRECT,
    "CROSSSLOT": RedisFailure.CROSS_SLOT,
    "CLUSTERDOWN": RedisFailure.CLUSTER_DOWN,
    "TRYAGAIN": RedisFailure.MIGRATING,
    "LOADING": RedisFailure.LOADING,
}
_CODE = re.compile(rf"(?:^|: -?)({'|'.join(_CODES)})\b")
# A BlockingConnectionPool that waited its timeout for a free connection says so
# with a plain ConnectionError.
_POOL_WAIT = "No connection available"


def redis_failure(exc: Exception) -> RedisFailure:
    """The cause of a redis-py exception."""
    for kind, cause in _BY_CLASS:
        if isinstance(exc, kind):
            return cause
    if isinstance(exc, redis_errors.RedisClusterException):
        said = str(exc)
        for words, cause in _CLUSTER_CLIENT_MESSAGES:
            if words in said:
                return cause
        return RedisFailure.CLUSTER_CLIENT
    if isinstance(exc, redis_errors.ConnectionError):
        return RedisFailure.POOL_EXHAUSTED if _POOL_WAIT in str(exc) else RedisFailure.UNREACHABLE
    code = _CODE.search(str(exc))
    return _CODES[code.group(1)] if code else RedisFailure.REFUSED


@contextmanager
def translate_redis_errors(operation: str) -> Iterator[None]:
    """Raise any Redis error in the block as LedgerUnavailable naming `operation` and
    the cause; the ledger's own errors pass through."""
    try:
        yield
    except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
        raise LedgerUnavailable(operation, redis_failure(exc), str(exc)) from exc


def raise_for_reply(tenant: str, hold_id: str, operation: str, reply: list[object]) -> Status:
    """Map a script's non-success status to its exception; return the status otherwise."""
    status = Status(str(reply[0]))
    if status in (Status.OK, Status.EXISTS):
        return status
    if status is Status.BAD_INPUT:
        raise BadInput(str(reply[1]), str(reply[2]))
    if status is Status.UNKNOWN_ACCOUNT:
        raise UnknownAccount(tenant, str(reply[1]))
    if status is Status.NOT_FOUND:
        raise HoldNotFound(tenant, hold_id)
    if status is Status.REPRICE:
        alone = len(reply) > 4 and str(reply[4]) == "alone"
        raise PoolShrank(hold_id, open_pool(reply, 1), alone)
    if status is Status.NOT_DUE:
        raise HoldNotDue(hold_id)
    if status is Status.RATE_LIMITED:
        raise RateLimited(str(reply[1]), int(str(reply[2])))
    if status is Status.IN_FLIGHT:
        raise HoldInFlight(hold_id, int(str(reply[2])))
    if status is Status.ESCROWED:
        raise TenantEscrowed(tenant)
    if status is Status.SHORT:
        pairs = reply[3:]
        lacks = {str(a): int(str(b)) for a, b in zip(pairs[::2], pairs[1::2], strict=True)}
        raise ShortOfRoom(hold_id, str(reply[1]), lacks)
    state = HoldState(str(reply[1]))
    if status is Status.EXISTS_WITH_DIFFERENT_FINGERPRINT:
        raise IdempotencyConflict(hold_id, state, "a different request")
    if status is Status.EXISTS_WITH_DIFFERENT_AMOUNT:
        raise IdempotencyConflict(hold_id, state, "a post of a different amount")
    raise HoldStateConflict(hold_id, operation, state, str(reply[2]) if len(reply) > 2 else "")


def open_pool(reply: list[object], at: int) -> OpenPool:
    """The open set reserve.lua replies with, from element `at` (count, face sum,
    sum of squares)."""
    return OpenPool(int(str(reply[at])), int(str(reply[at + 1])), float(str(reply[at + 2])))
