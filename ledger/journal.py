"""The journal: every ledger transition of a tenant, in the order the scripts ran,
as entries of one Redis Stream. Reading it, and replaying it into balances."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import validate
from .client import Ledger
from .errors import translate_redis_errors
from .keys import journal_key
from .records import Provenance

PAGE = 2000
LAST_ENTRY_ID = f"{validate.MAX_STREAM_PART}-{validate.MAX_STREAM_PART}"
LIVE_STATES = ("pending", "escalated", "ambiguous")


@dataclass(frozen=True, slots=True)
class Delta:
    account: str
    pending: int
    posted: int


# A reserve entry keeps only its reason; the hold's state follows from it.
_RESERVED_STATE = {
    "within_budget": "pending",
    "soft_band": "escalated",
    "approval_threshold": "escalated",
}


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One transition: its kind (`op`) and its fields as stored. Entries are lean:
    what follows from other fields is derived here, not stored (`state`, `deltas`).

    The balance change is `d` (`account|dpending|dposted;...`) on most entries; a
    reserve of a kept hold has `acc` and `amt` (pending rises by each amount), a post
    `acc`, `pst` (posted rises) and `rel` (pending falls; absent when the hold had
    expired); `amt`, `pst` and `rel` are one number when it is every account's. A
    reserve's `prov` is a packed Provenance (records.py).
    """

    entry_id: str
    op: str
    fields: dict[str, str]

    @property
    def hold_id(self) -> str:
        return self.fields.get("hold", "")

    @property
    def state(self) -> str:
        """The hold's state after this entry ('' for an entry about no hold)."""
        f = self.fields
        if "st" in f:
            return f["st"]
        if self.op == "reserve":
            if "shadow" in f:  # held in shadow mode whatever the reason
                return "pending"
            return _RESERVED_STATE.get(self.reason, "denied")
        if self.op == "post":
            return "posted"
        return ""

    @property
    def reason(self) -> str:
        """A reserve's reason: `why`, which an admission within budget does not keep
        (issue 12: bytes in every entry); '' for other entries without one."""
        if self.op == "reserve":
            return self.fields.get("why", "within_budget")
        return self.fields.get("why", "")

    @property
    def provenance(self) -> Provenance | None:
        packed = self.fields.get("prov")
        return Provenance.unpacked(packed) if packed else None

    @property
    def deltas(self) -> tuple[Delta, ...]:
        f = self.fields
        if f.get("acc"):
            accounts = f["acc"].split(",")
            zero = [0] * len(accounts)
            n = len(accounts)
            if self.op == "reserve":
                pending, posted = _numbers(f["amt"], n), zero
            else:
                pending = [-x for x in _numbers(f["rel"], n)] if "rel" in f else zero
                posted = _numbers(f["pst"], n)
            return tuple(map(Delta, accounts, pending, posted))
        text = f.get("d", "")
        if not text:
            return ()
        out = []
        for part in text.split(";"):
            account, pending_text, posted_text = part.rsplit("|", 2)
            out.append(Delta(account, int(pending_text), int(posted_text)))
        return tuple(out)

    def as_dict(self) -> dict[str, str]:
        """The entry as a person reads it: derived state, provenance spelled out."""
        shown = {"id": self.entry_id, **self.fields}
        if self.reason:
            shown["why"] = self.reason
        if self.hold_id:
            shown["st"] = self.state
        provenance = self.provenance
        if provenance is not None:
            del shown["prov"]
            shown.update({k: str(v) for k, v in asdict(provenance).items()})
        return shown


def _numbers(text: str, accounts: int) -> list[int]:
    """One amount per account; a single one is every account's (journal_numbers in
    lua/_lib.lua; entries written before it have one per account)."""
    numbers = [int(x) for x in text.split(",")]
    return numbers * accounts if len(numbers) == 1 else numbers


async def read_journal(
    ledger: Ledger, tenant: str, *, after: str = "-", count: int = PAGE
) -> list[JournalEntry]:
    """One page of entries strictly after `after` ('-' from the start)."""
    key = journal_key(validate.tenant_id(tenant))
    if validate.journal_cursor(after) == LAST_ENTRY_ID:
        return []  # nothing can follow it, and Redis refuses it as an exclusive start
    start = "-" if after == "-" else f"({after}"
    with translate_redis_errors("reading the journal"):
        rows: list[tuple[str, dict[str, str]]] = await ledger.redis.xrange(  # type: ignore[assignment]
            key, min=start, max="+", count=count
        )
    return [JournalEntry(entry_id, fields["op"], fields) for entry_id, fields in rows]


async def iter_journal(
    ledger: Ledger, tenant: str, *, after: str = "-", upto: str = "+"
) -> AsyncIterator[JournalEntry]:
    """Every entry after `after`, up to and including `upto`."""
    while True:
        page = await read_journal(ledger, tenant, after=after)
        for entry in page:
            if upto != "+" and entry_order(entry.entry_id) > entry_order(upto):
                return
            yield entry
        if len(page) < PAGE:
            return
        after = page[-1].entry_id


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair (ms, seq)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class ReplayedAccount:
    limit: int = 0
    pending: int = 0
    posted: int = 0
    window_start_ms: int = 0
    # Temporary raises of the limit (lua/rule.lua): rule id -> [amount, until_ms].
    raises: dict[str, list[int]] = field(default_factory=dict)

    def limit_at(self, ms: int) -> int:
        """The limit reserve.lua applied at `ms`: the base plus the live raises, which
        count for at most the base."""
        live = sum(amount for amount, until in self.raises.values() if until > ms)
        return self.limit + min(live, self.limit)


@dataclass
class Replay:
    """Balances and hold states rebuilt from the journal alone, and any admission
    that took an account above its limit (contract 1) seen along the way."""

    accounts: dict[str, ReplayedAccount] = field(default_factory=dict)
    hold_states: dict[str, str] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    entries: int = 0

    def state(self) -> dict[str, object]:
        """What a checkpoint keeps: balances, and the holds still live (a settled
        hold's later transitions are journaled with their new state anyway)."""
        live = {h: s for h, s in self.hold_states.items() if s in LIVE_STATES}
        return {
            "entries": self.entries,
            "accounts": {a: asdict(b) for a, b in self.accounts.items()},
            "hold_states": live,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Replay:
        return cls(
            accounts={a: ReplayedAccount(**b) for a, b in state["accounts"].items()},
            hold_states=dict(state["hold_states"]),
            entries=int(state["entries"]),
        )

    def apply(self, entry: JournalEntry) -> None:
        self.entries += 1
        f = entry.fields
        if entry.op == "account":
            account = self.accounts.setdefault(f["acct"], ReplayedAccount())
            account.limit = int(f["limit"])
            account.window_start_ms = int(f["ws"])
            return
        if entry.op == "rule":
            self._apply_rule(f)
            return
        if entry.op == "escrow":
            # A transfer of an escrowed tenant's parent (lua/escrow.lua): its accounts'
            # limits and balances are the shards' (each replays its own journal).
            return
        if entry.op == "stress":
            # A route's stress detector turned on or off (lua/detector.lua): no balance.
            return
        if entry.op == "close":
            # An idle risk-factor account closed (lua/close.lua): it held nothing.
            closed = self.accounts.pop(f["acct"], None)
            if closed is not None and (closed.pending or closed.posted):
                self.violations.append(
                    f"entry {entry.entry_id}: {f['acct']} closed holding "
                    f"{closed.pending} pending and {closed.posted} posted"
                )
            return
        state = entry.state
        # A shadow hold (marked 'shadow': what enforcement would have done) is held
        # whatever the decision: contract 1 is what shadow mode relaxes.
        if entry.op == "reserve" and state in ("pending", "escalated") and "shadow" not in f:
            self._check_admission(entry)
        for delta in entry.deltas:
            account = self.accounts.setdefault(delta.account, ReplayedAccount())
            account.pending += delta.pending
            account.posted += delta.posted
            if entry.op == "roll":
                account.window_start_ms = int(f["ws"])
        if entry.hold_id:
            self.hold_states[entry.hold_id] = state

    def _apply_rule(self, f: dict[str, str]) -> None:
        """A rule set (replacing itself, and its raise on whichever account it was,
        as rule.lua does) or deleted."""
        rule = f["rule"]
        for account in self.accounts.values():
            account.raises.pop(rule, None)
        if f.get("act") != "delete" and "acct" in f:
            account = self.accounts.setdefault(f["acct"], ReplayedAccount())
            account.raises[rule] = [int(f["raise"]), int(f["until"])]

    def _check_admission(self, entry: JournalEntry) -> None:
        at_ms = entry_order(entry.entry_id)[0]
        for delta in entry.deltas:
            account = self.accounts.get(delta.account, ReplayedAccount())
            used = account.pending + account.posted
            limit = account.limit_at(at_ms)
            if used + delta.pending > limit:
                self.violations.append(
                    f"entry {entry.entry_id}: hold {entry.hold_id} took {delta.account} to "
                    f"{used + delta.pending} above its limit {limit}"
                )


def replay(entries: Iterable[JournalEntry]) -> Replay:
    result = Replay()
    for entry in entries:
        result.apply(entry)
    return result
