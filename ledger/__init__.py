"""irrev ledger: accounts, holds and the journal, kept atomically in Redis by Lua scripts.

This is the ledger's face: what the gateway, the shell and the simulator use. The
submodules behind it (key layout, scripts, validation) are the ledger's own business.
"""

from .archive import ARCHIVE_AFTER_MS, ArchivedCopyMissing, ArchivePass, archive_settled
from .audit import AuditReport, audit, audit_tenant
from .changes import ChangeFeed
from .checkpoint import cutoff_ms, trim, trim_locked
from .client import Ledger, open_ledger
from .cluster import cluster_enabled
from .connect import connect
from .durability import Durability, WriteProbe
from .embedded import EmbeddedRedis, supervised_redis_url
from .errors import (
    BadInput,
    CheckpointMoved,
    HoldInFlight,
    HoldNotDue,
    HoldNotFound,
    HoldStateConflict,
    IdempotencyConflict,
    KeyNotFound,
    KeyNotLive,
    LedgerError,
    LedgerUnavailable,
    PoolShrank,
    RateLimited,
    RedisFailure,
    ShortOfRoom,
    TenantEscrowed,
    UnknownAccount,
)
from .escrow import Defined, Escrow, EscrowConflict, Recovered
from .escrow_audit import EscrowAudit
from .journal import JournalEntry, iter_journal, read_journal
from .keystore import KeyKind, KeyRecord, KeySpec, KeyState, KeyStore
from .lease import Lease, Watch
from .limits import MAX_ACCOUNTS, MAX_AMOUNT, MAX_ID_CHARS
from .policystore import POLICY_HISTORY, PolicyRecord, PolicyStore, PutResult
from .ports import free_port, free_ports
from .records import (
    BODY_OMITTED_FLAG,
    RULE_PREFIX,
    AccountCheck,
    AccountSpec,
    AnswerAllowance,
    Attached,
    Balance,
    Hold,
    HoldState,
    Margin,
    OpenPool,
    Pace,
    PoolTicket,
    Provenance,
    Reason,
    ReserveRequest,
    ReserveResult,
    RouteOutcomes,
    Rule,
    Status,
    StressDetector,
    StressReading,
    SweepResult,
    TenantSnapshot,
    TransitionResult,
    Verdict,
    pool_tag,
)
from .redis_binary import EmbeddedRedisError
from .refusals import RefusalCount, RefusalCounts
from .settings import AppendFsync, LedgerSettings
from .tasks import stop_tasks
from .topology import failover_shortfall
from .validate import check_account_spec

__all__ = [
    "ARCHIVE_AFTER_MS",
    "BODY_OMITTED_FLAG",
    "MAX_ACCOUNTS",
    "MAX_AMOUNT",
    "MAX_ID_CHARS",
    "POLICY_HISTORY",
    "RULE_PREFIX",
    "AccountCheck",
    "AccountSpec",
    "AnswerAllowance",
    "AppendFsync",
    "ArchivePass",
    "ArchivedCopyMissing",
    "Attached",
    "AuditReport",
    "BadInput",
    "Balance",
    "ChangeFeed",
    "CheckpointMoved",
    "Defined",
    "Durability",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "Escrow",
    "EscrowAudit",
    "EscrowConflict",
    "Hold",
    "HoldInFlight",
    "HoldNotDue",
    "HoldNotFound",
    "HoldState",
    "HoldStateConflict",
    "IdempotencyConflict",
    "JournalEntry",
    "KeyKind",
    "KeyNotFound",
    "KeyNotLive",
    "KeyRecord",
    "KeySpec",
    "KeyState",
    "KeyStore",
    "Lease",
    "Ledger",
    "LedgerError",
    "LedgerSettings",
    "LedgerUnavailable",
    "Margin",
    "OpenPool",
    "Pace",
    "PolicyRecord",
    "PolicyStore",
    "PoolShrank",
    "PoolTicket",
    "Provenance",
    "PutResult",
    "RateLimited",
    "Reason",
    "Recovered",
    "RedisFailure",
    "RefusalCount",
    "RefusalCounts",
    "ReserveRequest",
    "ReserveResult",
    "RouteOutcomes",
    "Rule",
    "ShortOfRoom",
    "Status",
    "StressDetector",
    "StressReading",
    "SweepResult",
    "TenantEscrowed",
    "TenantSnapshot",
    "TransitionResult",
    "UnknownAccount",
    "Verdict",
    "Watch",
    "WriteProbe",
    "archive_settled",
    "audit",
    "audit_tenant",
    "check_account_spec",
    "cluster_enabled",
    "connect",
    "cutoff_ms",
    "failover_shortfall",
    "free_port",
    "free_ports",
    "iter_journal",
    "open_ledger",
    "pool_tag",
    "read_journal",
    "stop_tasks",
    "supervised_redis_url",
    "trim",
    "trim_locked",
]
