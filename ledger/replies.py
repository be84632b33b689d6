"""The scripts' replies, and the ledger's reads, parsed into records (ledger/records.py):
by lookup, as the hot path's reserve and transitions are parsed on every call."""

from __future__ import annotations

from collections.abc import Awaitable
from itertools import count, takewhile
from typing import Any

from .errors import LedgerUnavailable, RedisFailure, open_pool, raise_for_reply
from .records import (
    DECIDED_BY,
    NO_ACKS,
    AccountCheck,
    Acks,
    Balance,
    Hold,
    HoldState,
    Reason,
    ReserveResult,
    Status,
    TransitionResult,
    Verdict,
)


async def decoded(reply: Awaitable[Any]) -> Any:
    """A reply of the ledger's client, whose strings arrive decoded (decode_responses):
    redis-py types them as bytes | str."""
    return await reply


def reserve_result(
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


def transition_result(
    tenant: str, hold_id: str, operation: str, reply: list[Any], acked: Acks = NO_ACKS
) -> TransitionResult:
    status = _OK_STATUSES.get(reply[0]) or raise_for_reply(tenant, hold_id, operation, reply)
    flags = str(reply[2])
    if operation == "retry":  # its third field is the claim, not flags
        return TransitionResult(
            status=status,
            hold_id=hold_id,
            state=HoldState(reply[1]),
            flags=_NO_FLAGS,
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
_DECISIONS = {d.value: d for d in Verdict}
_REASONS = {r.value: r for r in Reason}
_STATES = {s.value: s for s in HoldState}
_NO_FLAGS: frozenset[str] = frozenset()
# The states whose payload is the outcome (settle_fields in lua/_lib.lua).
_SETTLED_WITH_OUTCOME = frozenset({HoldState.POSTED.value, HoldState.VOIDED.value})


def balance_from(account: str, values: list[str | None]) -> Balance:
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


def hold_from(hold_id: str, f: dict[str, str], payload: str | None) -> Hold:
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
