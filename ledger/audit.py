"""`irrev ledger audit`: replay each tenant's journal and check that it reproduces
every stored balance and hold (contract 7), that no admission ever overdrew an
account (contract 1), that the indexes the reconciler relies on are whole, and, for a
tenant split over escrow shards, that its limits are all held somewhere
(ledger/escrow_audit.py)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .checkpoint import replay_from_checkpoint
from .client import Ledger
from .errors import translate_redis_errors
from .escrow_audit import escrow_balance, split_shards
from .journal import LIVE_STATES, Replay
from .keys import accounts_key, ambiguous_key, deadlines_key, escalated_key, hold_key
from .records import HoldState


@dataclass
class AuditReport:
    tenant: str
    entries: int = 0
    accounts: int = 0
    live_holds: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


async def audit_tenant(ledger: Ledger, tenant: str) -> AuditReport:
    replayed = await replay_from_checkpoint(ledger, tenant)
    report = AuditReport(tenant, entries=replayed.entries)
    report.mismatches.extend(replayed.violations)
    await _check_balances(ledger, tenant, replayed, report)
    await _check_holds(ledger, tenant, replayed, report)
    shards = await split_shards(ledger, tenant)
    if shards:
        report.mismatches.extend((await escrow_balance(ledger, tenant, shards)).mismatches)
    return report


async def _check_balances(
    ledger: Ledger, tenant: str, replayed: Replay, report: AuditReport
) -> None:
    stored = {b.account: b for b in await ledger.balances(tenant)}
    report.accounts = len(stored)
    for account in sorted(set(stored) | set(replayed.accounts)):
        balance, expected = stored.get(account), replayed.accounts.get(account)
        if balance is None or expected is None:
            where = "the journal only" if balance is None else "Redis only"
            report.mismatches.append(f"{tenant} {account}: found in {where}")
            continue
        got = (balance.pending, balance.posted, balance.window_start_ms)
        want = (expected.pending, expected.posted, expected.window_start_ms)
        if got != want:
            report.mismatches.append(
                f"{tenant} {account}: stored pending/posted/window {got}, journal says {want}"
            )


async def _check_holds(ledger: Ledger, tenant: str, replayed: Replay, report: AuditReport) -> None:
    live = sorted(h for h, state in replayed.hold_states.items() if state in LIVE_STATES)
    report.live_holds = len(live)
    pending_by_account: dict[str, int] = defaultdict(int)
    redis = ledger.redis
    with translate_redis_errors("audit"):
        deadlines = set(await redis.zrange(deadlines_key(tenant), 0, -1))
        indexed = {
            HoldState.AMBIGUOUS.value: set(await redis.smembers(ambiguous_key(tenant))),
            HoldState.ESCALATED.value: set(await redis.smembers(escalated_key(tenant))),
        }
    for hold_id in live:
        hold = await ledger.hold(tenant, hold_id)
        want = replayed.hold_states[hold_id]
        if hold is None or hold.state.value != want:
            found = "missing" if hold is None else hold.state.value
            report.mismatches.append(
                f"{tenant} hold {hold_id}: stored {found}, journal says {want}"
            )
            continue
        for account, amount in hold.amounts.items():
            pending_by_account[account] += amount
        in_deadlines = hold_id in deadlines
        if in_deadlines != (want != HoldState.AMBIGUOUS.value):
            report.mismatches.append(f"{tenant} hold {hold_id}: deadline index out of step")
        for state, members in indexed.items():
            if (hold_id in members) != (want == state):
                report.mismatches.append(f"{tenant} hold {hold_id}: {state} index out of step")
    # An escalated hold joins its route's open set only when approved (_lib.lua's OPEN).
    opened = [h for h in live if replayed.hold_states[h] != HoldState.ESCALATED.value]
    await _check_pools(ledger, tenant, opened, report)
    waiting = [h for h in live if replayed.hold_states[h] == HoldState.ESCALATED.value]
    await _check_escalation_counts(ledger, tenant, waiting, report)
    for account, expected in sorted(replayed.accounts.items()):
        if pending_by_account.get(account, 0) != expected.pending:
            report.mismatches.append(
                f"{tenant} {account}: live holds charge {pending_by_account.get(account, 0)} "
                f"pending, the balance says {expected.pending}"
            )


async def audit(ledger: Ledger, tenants: list[str] | None = None) -> list[AuditReport]:
    chosen = tenants if tenants is not None else await ledger.tenants()
    return [await audit_tenant(ledger, tenant) for tenant in chosen]


async def _check_pools(ledger: Ledger, tenant: str, live: list[str], report: AuditReport) -> None:
    """Each calibrating route's open count and face sum (lua/_lib.lua) are those of
    the open holds (`live`: pending or ambiguous) that name it (`cr`: `<tag>|<face
    value>`): one read per live hold, pipelined. The sum of squares is a float and is
    not compared."""
    with translate_redis_errors("audit"):
        async with ledger.redis.pipeline(transaction=False) as pipe:
            for hold_id in live:
                pipe.hget(hold_key(tenant, hold_id), "cr")
            marks = await pipe.execute() if live else []
        stored = await ledger.open_pools(tenant)
    counted: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for mark in marks:
        if mark:
            tag, _, face = str(mark).partition("|")
            counted[tag][0] += 1
            counted[tag][1] += int(face)
    for tag in sorted(set(counted) | set(stored)):
        pool = stored.get(tag)
        got = (pool.count, pool.face_sum) if pool else (0, 0)
        want = tuple(counted.get(tag, (0, 0)))
        if got != want:
            report.mismatches.append(
                f"{tenant} route {tag}: {got[0]} holds open of face {got[1]} stored, "
                f"the live holds are {want[0]} of face {want[1]}"
            )


async def _check_escalation_counts(
    ledger: Ledger, tenant: str, waiting: list[str], report: AuditReport
) -> None:
    """Each agent account's count of escalations waiting (`<account>|esc`, which its
    max_escalations caps: reserve.lua) is the number of escalated holds that name it
    (`esc`). A count above them would refuse the agent's escalations for good: an
    older release's scripts resolving a counted hold leave it counted
    (docs/operations.md, "Rolling upgrades")."""
    with translate_redis_errors("audit"):
        async with ledger.redis.pipeline(transaction=False) as pipe:
            for hold_id in waiting:
                pipe.hget(hold_key(tenant, hold_id), "esc")
            marks = await pipe.execute() if waiting else []
        stored = {
            str(name).removesuffix("|esc"): int(value)
            async for name, value in ledger.redis.hscan_iter(accounts_key(tenant), match="*|esc")
        }
    counted: dict[str, int] = defaultdict(int)
    for mark in marks:
        if mark:
            counted[str(mark)] += 1
    for account in sorted(set(counted) | set(stored)):
        got, want = stored.get(account, 0), counted.get(account, 0)
        if got != want:
            report.mismatches.append(
                f"{tenant} {account}: {got} escalations counted waiting, "
                f"{want} escalated holds name it"
            )
