"""What every run checks, against the store and the upstream, never against what the
gateway said about itself:

- the journal replays to every balance (`audit_tenant`, what `irrev ledger audit`
  runs);
- no account's pending + posted is above its limit;
- no hold the run created was lost;
- every hold is settled, or ambiguous (still charged and listed for an operator);
- the upstream agrees with the ledger: an effect the upstream made is never
  released (voided or expired), a hold is never posted for an effect it never made,
  and no effect was forwarded more often than the cell allows.

Plus the tools some cells need: a snapshot of a tenant's keys (DUMP), its restore,
and a normalised view of the ledger state to compare two recoveries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis, RedisCluster

from gateway.edge.wire import upstream_key
from ledger import audit_tenant
from ledger.keys import (
    accounts_key,
    hold_key,
    journal_key,
    lease_key,
    refusals_prefix,
    webhook_lease_key,
)

from .bench import Run

SETTLED = {"posted", "voided", "expired", "rejected", "denied"}
RELEASED = {"voided", "expired", "rejected", "denied"}
# Readings of Redis's clock at the moment a script ran: `tp`, when a hold was posted,
# and `te`, when it ended otherwise.
# Recovery determinism is about what the ledger decides, not when it decided it.
CLOCK_FIELDS = {"tp", "te"}


@dataclass(frozen=True)
class Snapshot:
    """Every key of a tenant: its content (compared) and its DUMP (restored).

    DUMP bytes are not compared: a hash in the hashtable encoding dumps in the dict's
    iteration order, which an incremental rehash during a mere read can change.
    """

    content: dict[bytes, tuple[object, bool]]
    dumps: dict[bytes, bytes]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and self.content == other.content

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.content)))

    def diff(self, other: Snapshot) -> list[str]:
        names = sorted(set(self.content) | set(other.content))
        return [n.decode() for n in names if self.content.get(n) != other.content.get(n)]


async def _content(redis: Redis | RedisCluster, key: bytes) -> object:
    kind = await redis.type(key)
    if kind == b"hash":
        return sorted((await redis.hgetall(key)).items())
    if kind == b"stream":
        return await redis.xrange(key)
    if kind == b"zset":
        return await redis.zrange(key, 0, -1, withscores=True)
    if kind == b"set":
        return sorted(await redis.smembers(key))
    if kind == b"string":
        return await redis.get(key)
    return await redis.dump(key)


def _background(key: bytes, tenant: str) -> bool:
    """A lease of the tenant's background work (its sweeper's, its webhook
    dispatcher's), taken and renewed on a timer by whichever gateway holds it, or a
    minute's count of refused requests, which each worker adds on its own timer (a
    refused request is counted by design, and when the count lands is the timer's):
    none is an effect of a request on the ledger."""
    name = key.decode()
    return name in (
        lease_key(tenant, "sweep"),
        lease_key(tenant, "events"),
        webhook_lease_key(tenant),
    ) or name.startswith(refusals_prefix(tenant))


async def snapshot(run: Run, tenant: str = "") -> Snapshot:
    redis = run.bench.redis
    content, dumps = {}, {}
    for key in await run.tenant_keys(tenant):
        if _background(key, tenant or run.tenant):
            continue
        dumped = await redis.dump(key)
        if dumped is not None:
            # The TTL is kept only as "has one or not": it counts down between snapshots.
            content[key] = (await _content(redis, key), await redis.pttl(key) > 0)
            dumps[key] = dumped
    return Snapshot(content, dumps)


async def restore(run: Run, saved: Snapshot, tenant: str = "") -> None:
    """Put the tenant's keys back exactly as saved (and remove any created since)."""
    redis = run.bench.redis
    current = await run.tenant_keys(tenant)
    if current:
        await redis.delete(*current)
    for key, dumped in saved.dumps.items():
        await redis.restore(key, 0, dumped, replace=True)
        if saved.content[key][1]:
            await redis.pexpire(key, run.bench.ledger.retention_ms)


async def ledger_state(run: Run, tenant: str = "") -> dict[str, Any]:
    """Holds, accounts and the journal (without its time-based entry ids)."""
    tenant = tenant or run.tenant
    redis = run.bench.ledger.redis
    holds = {}
    for key in await run.tenant_keys(tenant):
        name = key.decode()
        if name.startswith(hold_key(tenant, "")) or name == accounts_key(tenant):
            fields = await redis.hgetall(name)
            holds[name] = {k: v for k, v in fields.items() if k not in CLOCK_FIELDS}
    entries: list[tuple[str, dict[str, str]]] = await redis.xrange(journal_key(tenant))  # type: ignore[assignment]
    journal = [fields for _, fields in entries]
    return {"records": holds, "journal": journal}


async def check_ledger(
    run: Run,
    expected_holds: Iterable[str] = (),
    *,
    unresolved: Iterable[str] | None = None,
    max_forwards: int = 1,
    tenant: str = "",
) -> list[str]:
    """Every invariant of the module docstring; returns the violations found."""
    tenant = tenant or run.tenant
    ledger = run.bench.ledger
    violations: list[str] = []
    report = await audit_tenant(ledger, tenant)
    violations += [f"audit: {m}" for m in report.mismatches]
    for balance in await ledger.balances(tenant):
        if balance.used > balance.limit:
            violations.append(f"{balance.account} over its limit: {balance.used} > {balance.limit}")
    stats = await run.supplier_stats()
    orders, by_key = set(stats["keys"]), stats["requests_by_key"]
    listed = None if unresolved is None else set(unresolved)
    for hold_id in expected_holds:
        if await ledger.hold(tenant, hold_id) is None:
            violations.append(f"hold {hold_id} lost")
    prefix = hold_key(tenant, "")
    for key in await run.tenant_keys(tenant):
        name = key.decode()
        if not name.startswith(prefix):
            continue
        hold_id = name[len(prefix) :]
        hold = await ledger.hold(tenant, hold_id)
        if hold is None:
            continue
        state = hold.state.value
        made = upstream_key(hold_id) in orders
        if state == "ambiguous" and listed is not None and hold_id not in listed:
            violations.append(f"hold {hold_id} ambiguous but not listed for an operator")
        if state not in SETTLED and state not in ("ambiguous", "escalated"):
            violations.append(f"hold {hold_id} left {state}")
        if made and state in RELEASED:
            violations.append(f"hold {hold_id} {state} although the upstream made the effect")
        if not made and state == "posted":
            violations.append(f"hold {hold_id} posted although the upstream never made it")
        forwards = by_key.get(upstream_key(hold_id), 0)
        if forwards > max_forwards:
            violations.append(f"hold {hold_id} forwarded {forwards} times (at most {max_forwards})")
    return violations


async def check_recovery_determinism(run: Run, gateway: int = 0) -> list[str]:
    """Reconcile twice from the same saved store; the two results must be equal."""
    await run.bench.ledger.sweep(run.tenant, batch=1000)
    saved = await snapshot(run)
    first_report = await run.reconcile(gateway)
    first = await ledger_state(run)
    await restore(run, saved)
    second_report = await run.reconcile(gateway)
    second = await ledger_state(run)
    violations = []
    if first != second:
        violations.append("reconciling twice from the same store gave different ledgers")
    if _sorted(first_report) != _sorted(second_report):
        violations.append(
            f"reconciling twice gave different reports: {first_report} vs {second_report}"
        )
    return violations


def _sorted(report: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(v) if isinstance(v, list) else v for k, v in report.items()}
