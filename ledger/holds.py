"""A Ledger's writes of holds: reserve (one, a batch, or grouped with its tenant's
concurrent reserves: ledger/group.py), attach a keyless call to its hold, post (as
reserve), and the sweep of due holds, each one script in the tenant's slot. The
other transitions of a held hold are ledger/transitions.py's."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from redis import exceptions as redis_errors

from . import validate
from .archive import restore
from .errors import (
    BadInput,
    LedgerError,
    LedgerUnavailable,
    raise_for_reply,
    translate_redis_errors,
)
from .group import Coalescer
from .keys import (
    accounts_key,
    content_key,
    hold_key,
    hold_keys,
    hold_script_keys,
    reserve_keys,
    settled_key,
    settling_keys,
    tenant_keys,
)
from .records import (
    NO_ACKS,
    AccountSpec,
    Acks,
    AnswerAllowance,
    Attached,
    PoolTicket,
    Provenance,
    ReserveRequest,
    ReserveResult,
    SweepResult,
    TransitionResult,
)
from .release import COUNTED_ESCALATIONS
from .replies import reserve_result, transition_result

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose attributes and calls it uses; at run
    # time a plain mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object

DAY_MS = 24 * 3600 * 1000
# reserve.lua's answer while holds are due, the flag that makes it decide anyway, and
# the one that makes it look for due holds before any decision (a batch's items).
EXPIRE_FIRST = "expire_first"
DECIDE_ANYWAY = "1"
IN_ORDER = "2"
SWEEP_BATCH = 100
# The tenant's keys every hold script takes first (KEYS[1..5]: keys.tenant_keys).
STANDARD = 5
# A packed Provenance: reserve.lua's MAX_PROVENANCE (a path of an unknown route is
# the route id; HTTP servers refuse a request line past 16 KiB).
MAX_PROVENANCE_BYTES = 16384
MAX_SWEEPS_BEFORE_RESERVE = 10
# Generations of one keyless content a call walks through before it gives up: the
# index jumps it to the newest, so more than two steps mean the index was lost while
# old settled holds remain (attach.lua).
MAX_ATTACH_STEPS = 64
T = TypeVar("T")


class Holds(LedgerCore):
    """Holds: admitted, escalated or denied, then settled (a mixin of Ledger)."""

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
        escrowed: bool = False,
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
        open. `escrowed`: `tenant` is an escrow shard (ledger/escrow.py), and a
        refusal for want of room raises ShortOfRoom, nothing written.
        """
        reserve = ReserveRequest(
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            amounts=amounts,
            ttl_ms=ttl_ms,
            escalation_ttl_ms=escalation_ttl_ms,
            armed=armed,
            escalate_above=escalate_above,
            request=request,
            open_missing=open_missing,
            provenance=provenance,
            shadow=shadow,
            pool=pool,
            escrowed=escrowed,
        )
        args = self.reserve_args(reserve)  # first: its errors name the idempotency key
        if self._reserve_groups is not None:
            return await self._reserve_groups.submit(validate.tenant_id(tenant), (reserve, args))
        return await self._reserve_alone(tenant, reserve, args)

    async def _reserve_alone(
        self, tenant: str, reserve: ReserveRequest, args: list[str]
    ) -> ReserveResult:
        hold_id = reserve.idempotency_key
        keys = [*self._hold_keys(tenant, hold_id), settled_key(tenant)]
        reply, acked = await self._on_hold("reserve", tenant, hold_id, keys, args)
        if reply[0] == EXPIRE_FIRST:
            await self._expire_due(tenant)
            args = _deciding(args, reserve.pool)
            reply, acked = await self._on_hold("reserve", tenant, hold_id, keys, args)
        return reserve_result(tenant, hold_id, reply, acked)

    @cached_property
    def _reserve_groups(
        self,
    ) -> Coalescer[tuple[ReserveRequest, list[str]], ReserveResult] | None:
        """Group commit of concurrent reserves (ledger/group.py), when asked for."""
        if not self.group_wait_ms:
            return None
        return Coalescer(
            self._send_reserves,
            wait_ms=self.group_wait_ms,
            sent=self._told_group("reserve"),
        )

    async def _send_reserves(
        self, tenant: str, items: list[tuple[ReserveRequest, list[str]]]
    ) -> Sequence[ReserveResult | LedgerError]:
        """A group of reserves: alone, as `reserve`; several, as one call of
        reserve_many's, each item deciding in the order it arrived."""
        if len(items) == 1:
            try:
                return [await self._reserve_alone(tenant, *items[0])]
            except LedgerError as exc:
                return [exc]
        requests = [request for request, _ in items]
        batch = [(r.idempotency_key, _in_order(args, r.pool)) for r, args in items]
        return await self._reserves(tenant, requests, batch, grouped=True)

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

    async def reserve_many(
        self, tenant: str, requests: Sequence[ReserveRequest], *, grouped: bool = False
    ) -> list[ReserveResult | LedgerError]:
        """Several reserves in one pipelined round trip, for batch callers such as the
        simulator. Each is still its own atomic script, run in order; an item that
        fails gets its error in its place, and the others are applied. The batch is
        followed by the ledger's waits, as `reserve` is: each result says what they
        acknowledged. `grouped`: the batch goes as one script call (`Scripts.
        call_group`), which pays Redis's cost per command once (a small part of a
        reserve's: docs/performance.md, "Group commit")."""
        batch = [
            (request.idempotency_key, self.reserve_args(request, batched=True))
            for request in requests
        ]
        return await self._reserves(tenant, requests, batch, grouped)

    async def _reserves(
        self,
        tenant: str,
        requests: Sequence[ReserveRequest],
        batch: list[tuple[str, list[str]]],
        grouped: bool,
    ) -> list[ReserveResult | LedgerError]:
        """`reserve_many` of (hold id, reserve.lua's ARGV) for `requests`."""
        replies = await self._run_many("reserve", tenant, batch, grouped)
        archived = [i for i, (reply, _) in enumerate(replies) if _is_reply(reply, "archived")]
        for i in archived:
            await restore(self, tenant, batch[i][0])
        if archived:  # replays now, which no item of the batch can have changed
            again_replies = await self._run_many(
                "reserve", tenant, [batch[i] for i in archived], grouped
            )
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
                again, await self._run_many("reserve", tenant, retried, grouped), strict=True
            ):
                replies[i] = reply
        return [
            _or_error(reserve_result, tenant, request.idempotency_key, reply, acked=acked)
            for request, (reply, acked) in zip(requests, replies, strict=True)
        ]

    async def post_many(
        self,
        tenant: str,
        posts: Sequence[tuple[str, int | Mapping[str, int]]],
        *,
        outcome: str = "",
        grouped: bool = False,
    ) -> list[TransitionResult | LedgerError]:
        """Several posts of (hold id, amount) in one pipelined round trip, with errors
        in place as in `reserve_many`; `outcome` is kept with each (as `post`'s). A post
        its waits acknowledged short is kept and reported as `post`'s is. `grouped` as
        in `reserve_many`."""
        kept = validate.blob("outcome", outcome)  # once: it is every item's
        batch = [(hold_id, self._post_args(hold_id, amount, kept)) for hold_id, amount in posts]
        return await self._posts(tenant, batch, grouped)

    async def _posts(
        self, tenant: str, batch: list[tuple[str, list[str]]], grouped: bool
    ) -> list[TransitionResult | LedgerError]:
        """`post_many` of (hold id, post.lua's ARGV) pairs: each with its own outcome."""
        replies = await self._run_many("post", tenant, batch, grouped)
        # A hold archived out of the slot (a replay of its post): brought back, and
        # its post sent again, as `post` does (_on_hold).
        gone = [i for i, (item, _) in enumerate(replies) if _is_reply(item, "not_found")]
        gone = [i for i in gone if await restore(self, tenant, batch[i][0])]
        if gone:
            again = await self._run_many("post", tenant, [batch[i] for i in gone], grouped)
            for i, done in zip(gone, again, strict=True):
                replies[i] = done
        results: list[TransitionResult | LedgerError] = []
        for (hold_id, _), (reply, acked) in zip(batch, replies, strict=True):
            result = _or_error(transition_result, tenant, hold_id, "post", reply, acked=acked)
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
        args = [
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
            "2" if r.escrowed else "1" if r.shadow else "0",
            *_pool_args(r.pool),
        ]
        return _in_order(args, r.pool) if batched else args

    async def _run_many(
        self, operation: str, tenant: str, batch: list[tuple[str, list[str]]], grouped: bool
    ) -> list[tuple[list[Any] | LedgerError, Acks]]:
        """One pipeline of calls, each item (hold id, args) in order (on a cluster, to
        the primary of the tenant's slot; items redirected by a slot migration are
        sent again one by one), followed by the ledger's waits: each item's reply with
        what they acknowledged (NO_ACKS when none are asked for). Items Redis answered
        with an error get a LedgerUnavailable in place."""
        tenant = validate.tenant_id(tenant)
        if operation == "reserve":
            calls = [(reserve_keys(tenant, hold_id), args) for hold_id, args in batch]
        else:
            calls = [
                (settling_keys(hold_script_keys(tenant, hold_id), tenant, operation, args), args)
                for hold_id, args in batch
            ]
        with translate_redis_errors(operation):
            if grouped:
                replies = await self._scripts.call_group(operation, STANDARD, calls, self.waits)
            else:
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
        self,
        tenant: str,
        hold_id: str,
        amount: int | Mapping[str, int],
        *,
        outcome: str = "",
        allowance: AnswerAllowance | None = None,
    ) -> TransitionResult:
        """The effect happened at `amount` (its realised residual): for every account,
        or per account. Above the hold it is an overrun: posted and flagged.
        `outcome` (the upstream's answer) is kept for repeats of the request, within
        `allowance` if given (else its short form: the result's flags say so)."""
        args = self.post_args(hold_id, amount, outcome, allowance)
        if self._post_groups is not None:
            return await self._post_groups.submit(validate.tenant_id(tenant), (hold_id, args))
        return await self._transition("post", tenant, hold_id, args, replicated=True)

    @cached_property
    def _post_groups(self) -> Coalescer[tuple[str, list[str]], TransitionResult] | None:
        """Group commit of concurrent posts (ledger/group.py), when asked for."""
        if not self.group_wait_ms:
            return None
        return Coalescer(
            self._send_posts, wait_ms=self.group_wait_ms, sent=self._told_group("post")
        )

    def _told_group(self, operation: str) -> Callable[[int], None]:
        """What tells `on_group` the size of each group of `operation` sent."""

        def told(size: int) -> None:
            if self.on_group is not None:
                self.on_group(operation, size)

        return told

    async def _send_posts(
        self, tenant: str, items: list[tuple[str, list[str]]]
    ) -> Sequence[TransitionResult | LedgerError]:
        """A group of posts: alone, as `post`; several, as one call of post_many's."""
        if len(items) == 1:
            try:
                return [await self._transition("post", tenant, *items[0], replicated=True)]
            except LedgerError as exc:
                return [exc]
        return await self._posts(tenant, items, grouped=True)

    def post_args(
        self,
        hold_id: str,
        amount: int | Mapping[str, int],
        outcome: str = "",
        allowance: AnswerAllowance | None = None,
    ) -> list[str]:
        """post.lua's ARGV on this ledger (validated: BadInput names what is wrong), for
        callers that time or test the script itself."""
        return self._post_args(hold_id, amount, validate.blob("outcome", outcome), allowance)

    def _post_args(
        self,
        hold_id: str,
        amount: int | Mapping[str, int],
        outcome: str,
        allowance: AnswerAllowance | None = None,
    ) -> list[str]:
        """post_args with `outcome` already validated."""
        kept = validate.allowance_args(allowance)
        return [*self._hold_args(hold_id), outcome, *kept, *validate.per_account(amount)]

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


def _in_order(args: list[str], pool: PoolTicket | None) -> list[str]:
    """reserve.lua's ARGV as an item of a batch: one that looks for due holds before
    any decision (a calibrating route's reserve always looks: `_pool_args`)."""
    return args if pool is not None else [*args, IN_ORDER]


def _or_error(parse: Callable[..., T], *args: Any, acked: Acks) -> T | LedgerError:
    """`parse(*args, acked)`, whose last argument is a reply; an error in its place (or
    one the reply stands for) is returned, not raised."""
    if isinstance(args[-1], LedgerError):
        return args[-1]
    try:
        return parse(*args, acked)
    except LedgerError as exc:
        return exc


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
