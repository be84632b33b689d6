"""Checks on what callers pass to the ledger, so a mistake is named before it reaches
Redis. The scripts check the same things again (they must not trust their callers)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .errors import BadInput
from .limits import MAX_ACCOUNTS, MAX_AMOUNT, MAX_ID_CHARS
from .records import AccountKind, AccountSpec, AnswerAllowance, Pace

MAX_TTL_MS = 366 * 24 * 3600 * 1000
MAX_ESCALATIONS = 100_000
MAX_NEW_ACCOUNTS = 10_000_000
MAX_BLOB_BYTES = 1 << 20
_ID = re.compile(rf"[A-Za-z0-9._:@/-]{{1,{MAX_ID_CHARS}}}")
# A tenant, or one of its escrow shards (ledger/keys.py's shard_tenant).
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}(~e[0-9]{1,2}(x[0-9]{1,4})?)?")
_ENTRY_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")  # ASCII: \d takes any Unicode digit
MAX_STREAM_PART = 2**64 - 1
_KINDS = tuple(kind.value for kind in AccountKind)


def tenant_id(value: object) -> str:
    if not isinstance(value, str) or not _TENANT.fullmatch(value):
        raise BadInput("tenant", "must be 1-64 characters of [A-Za-z0-9._-]")
    return value


def journal_cursor(value: object) -> str:
    """'-' (from the start) or a journal entry id `ms-seq` Redis would accept."""
    match = _ENTRY_ID.fullmatch(value) if isinstance(value, str) else None
    if value != "-" and (match is None or max(map(int, match.groups())) > MAX_STREAM_PART):
        raise BadInput(
            "after", f"must be '-' or a journal entry id such as 1700000000000-0 (got {value!r})"
        )
    return str(value)


def identifier(field: str, value: object) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise BadInput(field, "must be 1-128 characters of [A-Za-z0-9._:@/-]")
    return value


def account_id(value: object) -> str:
    account = identifier("account", value)
    kind, _, name = account.partition(":")
    if kind not in _KINDS or not name:
        raise BadInput("account", f"must be kind:name with kind one of {', '.join(_KINDS)}")
    return account


def check_account_spec(spec: AccountSpec) -> None:
    """BadInput unless `upsert_account` would take `spec`: for a caller that must know
    before it writes anything else (a policy's accounts, before its version is stored)."""
    account_args(spec)


def account_args(spec: AccountSpec) -> list[str]:
    """account id, limit, soft limit, window_ms, approval threshold (account.lua, and
    each account a reserve may open)."""
    return [
        account_id(spec.account),
        str(amount("limit", spec.limit)),
        str(amount("soft_limit", spec.soft_limit, spec.limit)),
        str(ttl("window_ms", spec.window_ms)),
        str(amount("approval_threshold", spec.approval_threshold)),
    ]


def upsert_args(spec: AccountSpec) -> list[str]:
    """account.lua's arguments: account_args, an agent's bounds on its waiting
    escalations and on the risk-factor accounts its holds open per window, and the
    account's rates for effects and reads."""
    escalations = amount("max_escalations", spec.max_escalations, MAX_ESCALATIONS)
    opened = amount("max_new_accounts", spec.max_new_accounts, MAX_NEW_ACCOUNTS)
    paces = [pace_text(spec.effect_pace), pace_text(spec.read_pace)]
    return [*account_args(spec), str(escalations), str(opened), *paces]


def pace_text(pace: Pace | None) -> str:
    if pace is None:
        return ""
    interval = amount("interval_ms", pace.interval_ms)
    if interval == 0:
        raise BadInput("interval_ms", "must be above 0")
    return f"{interval},{amount('slack_ms', pace.slack_ms)}"


def amount(field: str, value: object, maximum: int = MAX_AMOUNT) -> int:
    # bool is an int subclass; True is no amount of money.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(field, f"must be an integer, not {type(value).__name__}")
    if not 0 <= value <= maximum:
        raise BadInput(field, f"must be between 0 and {maximum}, got {value}")
    return value


def ttl(field: str, value: object) -> int:
    return amount(field, value, MAX_TTL_MS)


def blob(field: str, value: object) -> str:
    if not isinstance(value, str) or len(value.encode()) > MAX_BLOB_BYTES:
        raise BadInput(field, f"must be text of at most {MAX_BLOB_BYTES} bytes")
    return value


def allowance_args(allowance: AnswerAllowance | None) -> list[str]:
    """ARGV[4..6] of post.lua and void.lua: agent, short outcome, bytes per day ('' x 3
    for none)."""
    if allowance is None:
        return ["", "", ""]
    if not allowance.short:
        raise BadInput("short", "must not be empty")
    return [
        identifier("agent", allowance.agent),
        blob("short", allowance.short),
        str(amount("allowance", allowance.bytes_per_day)),
    ]


MAX_NOTE_BYTES = 2048


def note(value: object) -> str:
    """A person's note on a decision: printable text (no control characters, which
    would forge lines in logs and terminals), at most MAX_NOTE_BYTES of UTF-8."""
    if not isinstance(value, str) or len(value.encode()) > MAX_NOTE_BYTES:
        raise BadInput("reason", f"must be text of at most {MAX_NOTE_BYTES} bytes")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise BadInput("reason", "must not contain control characters")
    return value


def account_amounts(amounts: Mapping[str, int]) -> list[str]:
    """Flatten {account: amount} into the scripts' `n, account, amount, ...` form."""
    if not isinstance(amounts, Mapping) or not 1 <= len(amounts) <= MAX_ACCOUNTS:
        raise BadInput("accounts", f"must name 1 to {MAX_ACCOUNTS} accounts")
    args = [str(len(amounts))]
    for account, value in amounts.items():
        args += [account_id(account), str(amount("amount", value))]
    return args


def per_account(value: int | Mapping[str, int]) -> list[str]:
    """An amount for every account of a hold (`*`), or one per named account."""
    if isinstance(value, Mapping):
        return account_amounts(value)
    return ["*", str(amount("amount", value))]
