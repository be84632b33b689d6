"""Escrow: one tenant's budget split over shards, for a tenant whose fleet needs more
than one Redis core (every key of a tenant is in one slot, so on one primary).

Each shard is a ledger tenant of its own (`<tenant>~e<k>`, placed so that the shards
land on different primaries), whose accounts hold a *slice* of each of the tenant's
limits; what no shard holds is the parent's `unleased` amount (lua/escrow.lua). A
reserve is one atomic script on one shard, chosen by its route key (the idempotency
key unless the caller names another, so a replay finds its hold). A reserve its
slices cannot hold comes back `short`, nothing written (reserve.lua): the shard is
refilled from the parent's unleased amount, which reclaims what other shards hold
unused when it runs low, and the reserve is asked again; past ATTEMPTS, the shard
decides as it stands (a denial is written there, as any).

Budget moves only by transfers with ids, in two steps on two slots: a refill is
debited from the parent (`grant`) before it is credited to the shard (`apply`); a
reclaim is taken from the shard (`yield`) before it is credited to the parent
(`receive`). Each receiving step counts an id once, and refuses one older than 7
days (_lib.lua's TRANSFER_RETENTION_MS: it may have forgotten it by then). So a
crash between the steps leaves budget in flight, which `recover()` finishes (or,
past the retention, leaves stranded), and never lets a unit of a limit be held in
two places: the tenant's
admissions stay within its limits however the transfers interleave or die.

What is per-slice, not per-tenant: an account's soft limit (each slice's is its
share of the band, and a reclaim keeps the share that covers what a slice holds, so
the shares add up to at most the band; but a hold may escalate on one shard while
others hold unused shares), and a denial (given when the shard's slice, after refills
and reclaims, cannot hold the effect: a concurrent refill elsewhere can take the room
first). Rules' temporary raises, rates and the agent bounds (max escalations, max
new accounts) are not carried to shards. `audit()` is exact while no transfer runs.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot

from . import validate
from .audit import audit_tenant
from .client import Ledger
from .errors import (
    BadInput,
    LedgerError,
    LedgerUnavailable,
    RedisFailure,
    ShortOfRoom,
    UnknownAccount,
    raise_for_reply,
    translate_redis_errors,
)
from .escrow_audit import (
    Definition,
    EscrowAccount,
    EscrowAudit,
    escrow_balance,
    parse_definition,
    read_hash,
    split_shards,
)
from .keys import (
    accounts_key,
    escrow_key,
    escrow_seen_key,
    shard_tenant,
    tenant_keys,
)
from .limits import MAX_AMOUNT
from .records import AccountSpec, Provenance, ReserveResult, TransitionResult
from .replies import decoded

DAY_MS = 24 * 3600 * 1000
# How many refills of its own a reserve its shard is short for makes (asking again
# after each).
ATTEMPTS = 6
# How many times in all, counting those it asks again after another's refill.
MAX_ASKS = 64
# A refill asks for at least limit / (shards x REFILL_PARTS): few transfers per
# admission, while most of a limit stays where any shard can have it.
REFILL_PARTS = 4
MAX_SHARDS = 64
MAX_SALT = 9999


class EscrowConflict(LedgerError):
    """The tenant is split already over other shards, or is not split at all."""


@dataclass
class Recovered:
    """What recover() found in flight: transfers finished, and stranded ones (past the
    retention: their budget is held nowhere, and stays so)."""

    grants: int = 0
    reclaims: int = 0
    stranded: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Defined:
    """What define() did: `kept` if the account held a newer policy version's limits
    (nothing changed), and the parent's unleased amount of it afterwards."""

    kept: bool
    unleased: int


def _transfer_id(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}"


class Escrow:
    """One escrowed tenant on `ledger`: `await Escrow.split(ledger, tenant, k)` once,
    then `await Escrow.of(ledger, tenant)` in every process."""

    def __init__(self, ledger: Ledger, tenant: str, shards: Sequence[str]) -> None:
        self.ledger = ledger
        self.tenant = validate.tenant_id(tenant)
        self.shards = [validate.tenant_id(shard) for shard in shards]
        if not 1 <= len(self.shards) <= MAX_SHARDS:
            raise BadInput("shards", f"must be 1 to {MAX_SHARDS}")
        self._definitions: dict[str, Definition] = {}
        self._refills: dict[str, asyncio.Future[int]] = {}
        self._demand: dict[tuple[int, str], int] = {}

    @classmethod
    async def split(cls, ledger: Ledger, tenant: str, count: int) -> Escrow:
        """Split `tenant` over `count` shards, each in a slot of its own and, on a
        cluster, spread over the primaries in turn. Once only: a tenant split over
        other shards already raises EscrowConflict (its existing split is kept), and so
        does a tenant with accounts of its own; once split, neither the tenant nor its
        shards take a plain define or a reserve's opening of an account (BadInput)."""
        tenant = validate.tenant_id(tenant)
        if not 1 <= count <= MAX_SHARDS:
            raise BadInput("shards", f"must be 1 to {MAX_SHARDS}")
        names = await _placed(ledger, tenant, count)
        reply = await _write(ledger, "escrow", tenant, ["split", *names])
        if reply[0] == "conflict":
            raise EscrowConflict(
                f"tenant {tenant!r} is split already over {reply[1]}: open it with Escrow.of"
            )
        if reply[0] == "plain":
            raise EscrowConflict(
                f"tenant {tenant!r} has accounts of its own ({reply[1]} fields), which would "
                "hold budget beside its shards' slices: split a tenant before its accounts "
                "are defined, then define them with Escrow.define"
            )
        raise_for_reply(tenant, "", "escrow", reply)
        # The parent's audit checks the split (ledger/audit.py).
        await ledger.release.register(tenant, *names)
        return await cls.of(ledger, tenant)

    @classmethod
    async def of(cls, ledger: Ledger, tenant: str) -> Escrow:
        """The escrow of a tenant split before; EscrowConflict if it is not split."""
        tenant = validate.tenant_id(tenant)
        shards = await split_shards(ledger, tenant)
        if not shards:
            raise EscrowConflict(f"tenant {tenant!r} is not split into escrow shards")
        return cls(ledger, tenant, shards)

    def shard_for(self, route_key: str) -> int:
        """The shard of every call about `route_key` (stable: crc32)."""
        return zlib.crc32(route_key.encode()) % len(self.shards)

    async def define(self, spec: AccountSpec, policy_version: int | None = None) -> Defined:
        """Set an account's limits over the whole tenant. The shards take their slices
        as they need them; the slices they hold follow the new soft limit, window and
        threshold at once (`reshape`). A lowered limit takes unleased below zero: what
        the shards hold unused is reclaimed at once until it is not (what they hold
        pending and posted stays, as a plain account's balances do under a lowered
        limit). `policy_version`, as Ledger.upsert_account's: an account that holds a
        newer version's limits keeps them (`kept`); its shards are still shaped by
        what it holds, which finishes a define that died before its reshapes."""
        args = validate.account_args(spec)
        if policy_version is not None:
            args.append(str(validate.amount("policy_version", policy_version)))
        reply = await _write(self.ledger, "escrow", self.tenant, ["define", *args])
        kept = reply[0] == "kept"
        if kept:
            definition = await self._definition(spec.account, True)
        else:
            raise_for_reply(self.tenant, "", "escrow", reply)
            limit, soft, win, appr = (int(a) for a in args[1:5])
            definition = Definition(limit, soft, win, appr, int(reply[2]))
            self._definitions[spec.account] = definition
        shape = [*_limits(definition), str(definition.window_ms)]
        shape += [str(definition.approval_threshold), str(definition.generation)]
        for shard in self.shards:
            reshaped = await _write(
                self.ledger, "escrow_shard", shard, ["reshape", "r", spec.account, *shape]
            )
            raise_for_reply(shard, "", "escrow", reshaped)
        unleased = int(reply[1])
        for k in range(len(self.shards)):
            if unleased >= 0:
                break
            unleased += await self._reclaim(k, spec.account, -unleased, definition)
        return Defined(kept, unleased)

    async def reserve(
        self,
        idempotency_key: str,
        fingerprint: str,
        amounts: Mapping[str, int],
        *,
        ttl_ms: int,
        route_key: str = "",
        escalation_ttl_ms: int = DAY_MS,
        armed: bool = True,
        escalate_above: int = 0,
        request: str = "",
        provenance: Provenance | None = None,
    ) -> ReserveResult:
        """Ledger.reserve on the shard of `route_key` (default the idempotency key),
        refilling it while it is short (see the module). Not Ledger.reserve's
        `open_missing` (a shard account opened with a limit of its own would hold
        budget no transfer moved: accounts are `define`d), nor its `shadow` or
        calibrating `pool` (a pool's open set would count one shard's holds)."""
        k = self.shard_for(route_key or idempotency_key)
        shard = self.shards[k]
        options: dict[str, Any] = {
            "ttl_ms": ttl_ms,
            "escalation_ttl_ms": escalation_ttl_ms,
            "armed": armed,
            "escalate_above": escalate_above,
            "request": request,
            "provenance": provenance,
        }
        own = 0
        for _ in range(MAX_ASKS):
            if own >= ATTEMPTS:
                break
            try:
                return await self.ledger.reserve(
                    shard, idempotency_key, fingerprint, amounts, escrowed=True, **options
                )
            except UnknownAccount as exc:
                # Opened on the shard once (a hold names at most 8 accounts): not an
                # attempt, or a hold of a fresh shard's 8 accounts would run out.
                await self._open(k, exc.account)
            except ShortOfRoom as exc:
                soft = exc.reason == "soft_band"
                needs = {a: await self._slice_for(a, lack, soft) for a, lack in exc.lacks.items()}
                # A lack past what any limit can hold cannot be leased: decided as is.
                if any(need > MAX_AMOUNT for need in needs.values()):
                    break
                leased = [
                    await self._refill_once(k, account, need)
                    for account, need in needs.items()
                    if need > 0
                ]
                if not leased or False in leased:
                    break
                own += True in leased
        return await self.ledger.reserve(shard, idempotency_key, fingerprint, amounts, **options)

    async def post(
        self,
        hold_id: str,
        amount: int | Mapping[str, int],
        *,
        route_key: str = "",
        outcome: str = "",
    ) -> TransitionResult:
        shard = self.shards[self.shard_for(route_key or hold_id)]
        return await self.ledger.post(shard, hold_id, amount, outcome=outcome)

    async def void(self, hold_id: str, *, route_key: str = "") -> TransitionResult:
        shard = self.shards[self.shard_for(route_key or hold_id)]
        return await self.ledger.void(shard, hold_id)

    async def _open(self, k: int, account: str) -> None:
        """Open a defined `account` on shard `k` with a slice of 0, if it is missing;
        its refills (one at a time) give it its slice. Opening with a chunk instead, a
        fresh shard's first burst took a chunk per reserve, the whole limit."""
        definition = await self._definition(account)
        args = [str(definition.window_ms), str(definition.approval_threshold)]
        reply = await _write(
            self.ledger, "escrow_shard", self.shards[k], ["open", "o", account, *args]
        )
        raise_for_reply(self.shards[k], "", "escrow", reply)

    async def _refill_once(self, k: int, account: str, lack: int) -> bool | None:
        """`refill`, one at a time per account in this process, whichever shard it is
        for: a reserve short while another refill of the account runs waits for it
        and asks again (None), rather than race it for the same budget (two refills
        of one process reclaiming from each other's shards can each find nothing
        left), and the next refill of its shard asks for what the waiters lacked
        too. Otherwise, whether its own refill granted anything."""
        running = self._refills.get(account)
        if running is not None:
            self._demand[(k, account)] = self._demand.get((k, account), 0) + lack
            await asyncio.shield(running)
            return None
        demand = min(lack + self._demand.pop((k, account), 0), MAX_AMOUNT)
        task = asyncio.ensure_future(self.refill(k, account, lack, want=demand))
        self._refills[account] = task
        try:
            return await asyncio.shield(task) > 0
        finally:
            if self._refills.get(account) is task:
                del self._refills[account]

    async def refill(self, k: int, account: str, lack: int, *, want: int = 0) -> int:
        """Raise shard `k`'s slice of `account` by at least `lack` (by a refill's chunk
        when the parent has it): from the parent's unleased amount, reclaiming what
        the other shards hold unused when that is short. Returns what was granted, 0
        if the tenant as a whole had not `lack` to spare (no shard had room left to
        reclaim), or if another shard's refill took what was reclaimed ATTEMPTS times.
        `want`: what to ask of the parent when it has it, if above a refill's chunk."""
        chunk = max(await self._chunk(account, lack), want)
        for _ in range(ATTEMPTS):
            got = await self._grant(k, account, chunk, lack)
            if got:
                return got
            # Reclaimed by the chunk, not by the lack: a slice refilled by its lack
            # alone would be short again at its next hold.
            unleased = max(await self.unleased(account), 0)
            wanted, target = lack - unleased, chunk - unleased
            found = 0
            for step in range(1, len(self.shards)):
                if found >= target:
                    break
                found += await self.reclaim((k + step) % len(self.shards), account, target - found)
            if found < wanted:
                return 0
        return 0

    async def reclaim(self, k: int, account: str, want: int, keep: int = 0) -> int:
        """Take up to `want` of shard `k`'s unused slice of `account` back to the parent,
        leaving it `keep` of room; returns what was taken. The account's definition
        is read afresh (the slice's soft limit follows it; another process may have
        changed it since this one last read it)."""
        return await self._reclaim(k, account, want, await self._definition(account, True), keep)

    async def _reclaim(
        self, k: int, account: str, want: int, definition: Definition, keep: int = 0
    ) -> int:
        xid = _transfer_id("y")
        args = ["yield", xid, account, str(want), str(keep), *_limits(definition)]
        args.append(str(definition.generation))
        reply = await _write(self.ledger, "escrow_shard", self.shards[k], args)
        raise_for_reply(self.shards[k], "", "escrow", reply)
        amount, t0 = int(reply[1]), int(reply[2])
        if amount:
            await self._received(k, xid, account, amount, t0)
        return amount

    async def recover(self) -> Recovered:
        """Finish every transfer left between its two steps (a process that died, Redis
        unreachable): grants applied on their shard, reclaims received by the parent.
        Each step counts once however often it is sent, so this may run beside the
        transfers themselves."""
        done = Recovered()
        parent = await read_hash(self.ledger, escrow_key(self.tenant))
        for name, value in parent.items():
            if name.startswith("g|"):
                index, account, amount, t0 = value.split("|")
                definition = await self._definition(account, True)
                xid = name[2:]
                if await self._applied(int(index), xid, account, int(amount), int(t0), definition):
                    done.grants += 1
                else:
                    done.stranded.append(f"grant {xid}: {amount} of {account} to shard {index}")
        for k, shard in enumerate(self.shards):
            for name, value in (await read_hash(self.ledger, escrow_key(shard))).items():
                if name.startswith("y|"):
                    account, amount, t0 = value.split("|")
                    if await self._received(k, name[2:], account, int(amount), int(t0)):
                        done.reclaims += 1
                    else:
                        done.stranded.append(
                            f"reclaim {name[2:]}: {amount} of {account} from shard {k}"
                        )
        return done

    async def accounts(self) -> list[EscrowAccount]:
        """Every account the tenant defines, with its unleased amount and each shard's
        slice and use (what `irrev ledger escrow show` prints)."""
        parent = await read_hash(self.ledger, escrow_key(self.tenant))
        balances = [
            {b.account: b for b in await self.ledger.balances(shard)} for shard in self.shards
        ]
        shown = []
        for name in sorted(n for n in parent if n.startswith("a|")):
            account = name[2:]
            held = [b.get(account) for b in balances]
            shown.append(
                EscrowAccount(
                    account,
                    parse_definition(parent[name], int(parent.get(f"n|{account}", 0))),
                    int(parent.get(f"u|{account}", 0)),
                    tuple(0 if b is None else b.limit for b in held),
                    tuple(0 if b is None else b.used for b in held),
                )
            )
        return shown

    async def audit(self) -> EscrowAudit:
        """Each shard's own audit (its journal replays its balances and limits, no
        admission above its slice), and per account: unleased + slices + transfers in
        flight = the tenant's limit (escrow_audit.py). Exact while no transfer runs."""
        report = await escrow_balance(self.ledger, self.tenant, self.shards)
        for shard in self.shards:
            report.mismatches.extend((await audit_tenant(self.ledger, shard)).mismatches)
        return report

    async def _grant(self, k: int, account: str, want: int, least: int) -> int:
        """A refill of shard `k`: debited from the parent, then applied on the shard.
        0 when the parent's unleased amount is below `least` (nothing taken)."""
        xid = _transfer_id("g")
        args = ["grant", xid, str(k), account, str(want), str(least)]
        reply = await _write(self.ledger, "escrow", self.tenant, args)
        if reply[0] == "short":
            return 0
        raise_for_reply(self.tenant, "", "escrow", reply)
        amount, t0 = int(reply[1]), int(reply[2])
        definition = Definition(*(int(x) for x in reply[3:8]))
        self._definitions[account] = definition
        await self._applied(k, xid, account, amount, t0, definition)
        return amount

    async def _applied(
        self, k: int, xid: str, account: str, amount: int, t0: int, definition: Definition
    ) -> bool:
        """A grant's second step, then its forgetting on the parent; False if the shard
        refused it as stale (it stays in the parent, stranded)."""
        args = ["apply", xid, account, str(amount), str(t0), *_limits(definition)]
        args += [str(definition.window_ms), str(definition.approval_threshold)]
        args.append(str(definition.generation))
        reply = await _write(self.ledger, "escrow_shard", self.shards[k], args)
        if reply[0] == "stale":
            return False
        raise_for_reply(self.shards[k], "", "escrow", reply)
        await _write(self.ledger, "escrow", self.tenant, ["granted", xid])
        return True

    async def _received(self, k: int, xid: str, account: str, amount: int, t0: int) -> bool:
        """A reclaim's second step, then its forgetting on the shard; False if the
        parent refused it as stale (it stays on the shard, stranded)."""
        args = ["receive", xid, str(k), account, str(amount), str(t0)]
        reply = await _write(self.ledger, "escrow", self.tenant, args)
        if reply[0] == "stale":
            return False
        raise_for_reply(self.tenant, "", "escrow", reply)
        await _write(self.ledger, "escrow_shard", self.shards[k], ["yielded", xid])
        return True

    async def _definition(self, account: str, fresh: bool = False) -> Definition:
        """The account's definition, from this process's cache unless `fresh` (what
        sizes a refill may be stale; what a slice's soft limit is set from may not)."""
        definition = None if fresh else self._definitions.get(account)
        if definition is None:
            key = escrow_key(self.tenant)
            with translate_redis_errors("escrow"):
                text, generation = await decoded(
                    self.ledger.redis.hmget(key, [f"a|{account}", f"n|{account}"])
                )
            if not text:
                raise UnknownAccount(self.tenant, account)
            definition = parse_definition(str(text), int(generation or 0))
            self._definitions[account] = definition
        return definition

    async def used(self, account: str) -> int:
        """What `account` holds pending and posted over every shard."""
        total = 0
        for shard in self.shards:
            balance = await self.ledger.balance(shard, account)
            total += 0 if balance is None else balance.used
        return total

    async def unleased(self, account: str) -> int:
        """What the parent holds of `account`'s limit that no shard does."""
        with translate_redis_errors("escrow"):
            text = await decoded(self.ledger.redis.hget(escrow_key(self.tenant), f"u|{account}"))
        return int(text or 0)

    async def _chunk(self, account: str, lack: int) -> int:
        definition = await self._definition(account)
        return max(lack, math.ceil(definition.limit / (len(self.shards) * REFILL_PARTS)))

    async def _slice_for(self, account: str, lack: int, soft: bool) -> int:
        """The slice `lack` of room takes: a soft band's lack (`soft`) is of the
        slice's share below its soft limit, which grows by soft / limit of what the
        slice grows."""
        definition = await self._definition(account)
        if not soft or lack <= 0 or definition.soft_limit >= definition.limit:
            return lack
        if definition.soft_limit == 0:
            return 0  # no slice has a share below a soft limit of 0: nothing to lease
        return -(-lack * definition.limit // definition.soft_limit)


def _limits(definition: Definition) -> list[str]:
    return [str(definition.limit), str(definition.soft_limit)]


async def _write(ledger: Ledger, operation: str, tenant: str, args: list[str]) -> list[Any]:
    """One escrow script on `tenant`'s slot, acknowledged as the ledger's writes of
    limits are (its waits): a transfer step lost in a failover could count its
    budget twice, so one short of them raises LedgerUnavailable, and the transfer
    stays in flight for recover()."""
    keys = [*tenant_keys(tenant)[:2], escrow_key(tenant), escrow_seen_key(tenant)]
    reply, acked = await ledger._run_replicated(operation, keys, args)
    if ledger._short(acked):
        raise LedgerUnavailable(
            "escrow",
            RedisFailure.NOT_REPLICATED,
            "a transfer step was not acknowledged as the ledger's writes must be; "
            "it stays in flight until recover() runs",
        )
    return [x.decode() if isinstance(x, bytes) else x for x in reply]


async def _placed(ledger: Ledger, tenant: str, count: int) -> list[str]:
    """`count` shard names, each in a slot of its own, shard k on the k-th primary in
    turn (a salt in the name moves a shard to another slot)."""
    topology = ledger.topology
    primaries = await topology.primaries()
    names: list[str] = []
    slots: set[int] = set()
    for k in range(count):
        wanted = primaries[k % len(primaries)]
        for salt in range(MAX_SALT + 1):
            name = shard_tenant(tenant, k, salt)
            slot = _slot(accounts_key(name))
            if slot not in slots and topology.primary_of(accounts_key(name)) == wanted:
                names.append(name)
                slots.add(slot)
                break
        else:
            raise BadInput("shards", f"found no slot for shard {k} on {wanted}")
    return names


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))
