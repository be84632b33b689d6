"""What an escrowed tenant's parent and shards hold (ledger/escrow.py), read back: each
account's definition, and the check that unleased + the shards' slices + the transfers
in flight = its limit. Its own module so that the ledger's audit (ledger/audit.py)
checks a split tenant too without importing the escrow's transfers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import translate_redis_errors
from .keys import accounts_key, escrow_key, escrow_seen_key
from .replies import decoded

if TYPE_CHECKING:
    from .client import Ledger


@dataclass(frozen=True, slots=True)
class Definition:
    """An escrowed account's limits over the whole tenant, and their generation (one
    more at each define; 0 for a definition written before generations were kept):
    a shard shapes its slice by the newest it has been given (lua/escrow_shard.lua)."""

    limit: int
    soft_limit: int
    window_ms: int
    approval_threshold: int
    generation: int = 0


def parse_definition(text: str, generation: int = 0) -> Definition:
    """`a|<account>`'s text, and its generation (`n|<account>`: lua/escrow.lua)."""
    limit, soft, win, appr = (int(part) for part in text.split(","))
    return Definition(limit, soft, win, appr, generation)


@dataclass(frozen=True, slots=True)
class EscrowAccount:
    """One account of a split tenant as it stands: its limits over the whole tenant,
    what the parent holds unleased, and per shard its slice and what it uses of it
    (pending + posted). Read slot by slot, so a transfer running meanwhile may show
    in neither or both places; `audit()` says whether the amounts add up."""

    account: str
    definition: Definition
    unleased: int
    slices: tuple[int, ...]
    used: tuple[int, ...]


@dataclass
class EscrowAudit:
    """Per account: unleased + the shards' slices + transfers in flight = its limit."""

    tenant: str
    accounts: int = 0
    in_flight: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


async def read_hash(ledger: Ledger, key: str) -> dict[str, str]:
    with translate_redis_errors("escrow"):
        return dict(await decoded(ledger.redis.hgetall(key)))


async def read_members(ledger: Ledger, key: str) -> list[str]:
    with translate_redis_errors("escrow"):
        return list(await decoded(ledger.redis.zrange(key, 0, -1)))


async def split_shards(ledger: Ledger, tenant: str) -> list[str]:
    """The shards `tenant` is split over; none if it is not split."""
    with translate_redis_errors("escrow"):
        names = await decoded(ledger.redis.hget(escrow_key(tenant), "shards"))
    return str(names).split(",") if names else []


async def escrow_balance(ledger: Ledger, tenant: str, shards: Sequence[str]) -> EscrowAudit:
    """Per account of the split `tenant`: its unleased amount, each shard's slice (its
    account's limit there), the grants not yet applied on their shard and the yields
    not yet received by the parent add up to its limit; and no shard holds an account
    the parent does not define. It reads several slots one after another: exact while
    no transfer runs."""
    report = EscrowAudit(tenant)
    parent = await read_hash(ledger, escrow_key(tenant))
    held: dict[str, int] = {}
    for name, value in parent.items():
        if name.startswith("u|"):
            held[name[2:]] = held.get(name[2:], 0) + int(value)
    received = set(await read_members(ledger, escrow_seen_key(tenant)))
    for k, shard in enumerate(shards):
        limits = await read_hash(ledger, accounts_key(shard))
        for name, value in limits.items():
            account, _, kind = name.rpartition("|")
            if kind == "limit" and not name.startswith("~"):
                held[account] = held.get(account, 0) + int(value)
        applied = set(await read_members(ledger, escrow_seen_key(shard)))
        for name, value in parent.items():
            grant = value.split("|")
            if name.startswith("g|") and int(grant[0]) == k and name[2:] not in applied:
                held[grant[1]] = held.get(grant[1], 0) + int(grant[2])
                report.in_flight += 1
        for name, value in (await read_hash(ledger, escrow_key(shard))).items():
            if name.startswith("y|") and name[2:] not in received:
                account, amount, _ = value.split("|")
                held[account] = held.get(account, 0) + int(amount)
                report.in_flight += 1
    defined = {
        name[2:]: parse_definition(value).limit
        for name, value in parent.items()
        if name.startswith("a|")
    }
    report.accounts = len(defined)
    for account in sorted(set(held) | set(defined)):
        if held.get(account, 0) != defined.get(account):
            report.mismatches.append(
                f"{tenant} {account}: unleased + slices + in flight = "
                f"{held.get(account, 0)}, its limit is {defined.get(account)}"
            )
    return report
