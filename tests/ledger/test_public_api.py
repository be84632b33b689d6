"""The ledger's face: `ledger` exports exactly this API; the gateway reaches the
ledger only through it (no submodule imports, no raw Redis handle), and so does the
shell, except the fault harness and benchmarks, which read and damage raw keys and
time raw Redis on purpose (`ledger.keys`, the handle)."""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import ledger

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
SHELL = ROOT / "irrev"
SHELL_MAY_IMPORT = {"ledger.keys"}

PUBLIC_API = {
    # the client, and where it connects
    "Ledger",
    "connect",
    "cluster_enabled",
    "open_ledger",
    "LedgerSettings",
    "AppendFsync",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "supervised_redis_url",
    "free_port",
    "free_ports",
    # settled holds out of the tenant's slot (ledger/archive.py)
    "ARCHIVE_AFTER_MS",
    "ArchivePass",
    "ArchivedCopyMissing",
    "archive_settled",
    # one holder at a time of background work
    "Lease",
    "Watch",
    # what the server does to keep writes, and whether it takes them now
    "Durability",
    "WriteProbe",
    # the fleet's versioned policies, and the announcements of their changes
    "PolicyStore",
    "ChangeFeed",
    # background tasks stopped whatever Python 3.11's wait_for swallows
    "stop_tasks",
    "POLICY_HISTORY",
    "PolicyRecord",
    "PutResult",
    # agent and admin keys managed at run time
    "KeyStore",
    "KeyKind",
    "KeySpec",
    "KeyState",
    "KeyRecord",
    # how many requests the gateways refused, per tenant and minute
    "RefusalCounts",
    "RefusalCount",
    # records
    "AccountCheck",
    "AccountSpec",
    "Attached",
    "Balance",
    "Verdict",
    "Hold",
    "HoldState",
    "Reason",
    "Provenance",
    "OpenPool",
    "Margin",
    "StressDetector",
    "StressReading",
    "Pace",
    "PoolTicket",
    "pool_tag",
    "ReserveRequest",
    "ReserveResult",
    "RouteOutcomes",
    "Rule",
    "RULE_PREFIX",
    "Status",
    "SweepResult",
    "TenantSnapshot",
    "TransitionResult",
    # an agent's allowance of answer bytes kept for its repeats, and a settlement's
    # flag when an answer was kept without its body
    "AnswerAllowance",
    "BODY_OMITTED_FLAG",
    # errors
    "LedgerError",
    "BadInput",
    "CheckpointMoved",
    "HoldNotDue",
    "HoldNotFound",
    "HoldInFlight",
    "HoldStateConflict",
    "IdempotencyConflict",
    "KeyNotFound",
    "KeyNotLive",
    "LedgerUnavailable",
    "PoolShrank",
    "RateLimited",
    "RedisFailure",
    "UnknownAccount",
    # the journal, its trimming, the audit
    "JournalEntry",
    "read_journal",
    "iter_journal",
    "cutoff_ms",
    "failover_shortfall",
    "trim",
    "trim_locked",
    "AuditReport",
    "audit",
    "audit_tenant",
    # a tenant split over escrow shards
    "Defined",
    "Escrow",
    "EscrowAudit",
    "EscrowConflict",
    "Recovered",
    "ShortOfRoom",
    "TenantEscrowed",
    # the bounds every layer enforces
    "MAX_AMOUNT",
    "MAX_ACCOUNTS",
    "MAX_ID_CHARS",
    "check_account_spec",
}


def test_the_face_exports_exactly_the_public_api() -> None:
    assert len(ledger.__all__) == len(set(ledger.__all__))
    assert set(ledger.__all__) == PUBLIC_API
    for name in PUBLIC_API:
        value = getattr(ledger, name)
        if isinstance(value, int | str):
            continue
        assert value.__module__.startswith("ledger."), name


def _is_ledger(node: ast.expr) -> bool:
    """`ledger`, `gate.ledger`, `Gate.of(request).ledger`: an expression naming a Ledger."""
    return (isinstance(node, ast.Name) and node.id == "ledger") or (
        isinstance(node, ast.Attribute) and node.attr == "ledger"
    )


def _violations(
    source: str, where: str, allowed: Collection[str] = (), handle: bool = False
) -> list[str]:
    """Imports of ledger submodules other than `allowed`; with `handle`, uses of a
    Ledger's raw Redis handle too."""
    tree = ast.parse(source, where)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module] if node.level == 0 and node.module else []
            else:
                modules = [alias.name for alias in node.names]
            found += [
                f"{where}:{node.lineno} imports {module}"
                for module in modules
                if module.startswith("ledger.") and module not in allowed
            ]
        if (
            handle
            and isinstance(node, ast.Attribute)
            and node.attr == "redis"
            and _is_ledger(node.value)
        ):
            found.append(f"{where}:{node.lineno} uses the ledger's raw Redis handle")
    return found


def _found(package: Path, allowed: Collection[str] = (), handle: bool = False) -> list[str]:
    files = sorted(package.rglob("*.py"))
    assert files, package
    return [
        violation
        for path in files
        for violation in _violations(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), allowed, handle
        )
    ]


def test_the_gateway_reaches_the_ledger_only_through_its_face() -> None:
    assert _found(GATEWAY, handle=True) == []


def test_the_shell_imports_the_face_and_the_key_layout_only() -> None:
    assert _found(SHELL, SHELL_MAY_IMPORT) == []


def test_the_check_sees_submodule_imports_and_the_raw_handle() -> None:
    sample = (
        "import ledger.keys\n"
        "from ledger.client import Ledger\n"
        "from ledger import Ledger as Face\n"
        "async def f(gate):\n"
        "    await gate.ledger.redis.ping()\n"
    )
    assert _violations(sample, "sample.py", handle=True) == [
        "sample.py:1 imports ledger.keys",
        "sample.py:2 imports ledger.client",
        "sample.py:5 uses the ledger's raw Redis handle",
    ]
    assert _violations(sample, "sample.py", {"ledger.keys"}) == [
        "sample.py:2 imports ledger.client"
    ]
