"""A small pure-Python model of the ledger's semantics: the oracle the stateful
property test compares the Redis scripts with. Never a substitute for Redis.

Time is abstract: a hold is either `due` (its deadline has passed: created with a
zero TTL) or not, which is all the scripts' decisions depend on when at most
LAZY_EXPIRY_BATCH holds are due at once (the property test keeps it so)."""

from __future__ import annotations

from dataclasses import dataclass, field

LIVE = ("pending", "escalated", "ambiguous")
MAX_AMOUNT = 2**53 - 1  # the ledger's largest exact amount (Lua numbers are doubles)


@dataclass
class RefAccount:
    limit: int
    soft: int
    approval: int = 0
    pending: int = 0
    posted: int = 0
    # Live raise_limit rules (rule.lua): rule id -> amount added to limit and soft
    # limit. The property test's rules live an hour, so none lapses within a run.
    raises: dict[str, int] = field(default_factory=dict)

    # reserve.lua counts the raises as at most the limit, and a limit with its
    # raises as at most MAX_AMOUNT.
    @property
    def raised(self) -> int:
        return min(sum(self.raises.values()), self.limit)

    @property
    def effective_limit(self) -> int:
        return min(self.limit + self.raised, MAX_AMOUNT)

    @property
    def effective_soft(self) -> int:
        return min(self.soft + self.raised, MAX_AMOUNT)


@dataclass
class RefHold:
    fingerprint: str
    state: str
    decision: str
    reason: str
    amounts: dict[str, int]
    checks: tuple[tuple[str, int, int, int], ...]
    armed: bool
    due: bool
    posted: dict[str, int] = field(default_factory=dict)
    compensated: dict[str, int] = field(default_factory=dict)
    request: str = ""
    # A retry's claim on an ambiguous hold (retry.lua), numbered (0: none); the
    # property test's window is an hour, so a claim never lapses within a run.
    claim: int = 0
    # A kept hold of a calibrating route: (route, face value); open while LIVE.
    pool: tuple[str, int] | None = None


class RefError(Exception):
    """The model's stand-in for a ledger exception: `kind` names which, `state` the
    hold's state where the ledger reports one."""

    def __init__(self, kind: str, state: str = "") -> None:
        super().__init__(kind, state)
        self.kind = kind
        self.state = state


@dataclass
class RefLedger:
    accounts: dict[str, RefAccount] = field(default_factory=dict)
    holds: dict[str, RefHold] = field(default_factory=dict)
    claims: int = 0  # retry claims made so far: the last one's number
    # Live rules that raise a limit: rule id -> the account it raises.
    rules: dict[str, str] = field(default_factory=dict)

    def open(self, account: str, limit: int, soft: int, approval: int = 0) -> None:
        raises = self.accounts[account].raises if account in self.accounts else {}
        self.accounts[account] = RefAccount(limit, soft, approval, raises=raises)

    def set_raise(self, rule: str, account: str, amount: int) -> None:
        """A raise_limit rule: `account` (which must exist) gets `amount` more limit
        and soft limit while it lives; setting it again replaces it, on whichever
        account it raised before. Refused (bad_input) if the account's live raises,
        this one's new amount included, would sum to more than its limit, or limit +
        raises past MAX_AMOUNT."""
        if account not in self.accounts:
            raise RefError("unknown_account")
        target = self.accounts[account]
        total = amount + sum(v for r, v in target.raises.items() if r != rule)
        if total > target.limit or target.limit + total > MAX_AMOUNT:
            raise RefError("bad_input")
        self.delete_rule(rule)
        self.accounts[account].raises[rule] = amount
        self.rules[rule] = account

    def delete_rule(self, rule: str) -> bool:
        account = self.rules.pop(rule, None)
        if account is None:
            return False
        self.accounts[account].raises.pop(rule, None)
        return True

    def _add(self, amounts: dict[str, int], pending: int, posted: dict[str, int] | None) -> None:
        for account, amount in amounts.items():
            self.accounts[account].pending += pending * amount
            if posted is not None:
                self.accounts[account].posted += posted[account]

    def _expire_one(self, hold: RefHold) -> None:
        if hold.state == "escalated" or (hold.state == "pending" and not hold.armed):
            self._add(hold.amounts, -1, None)
            hold.state = "expired"
        elif hold.state == "pending":
            hold.state = "ambiguous"

    def _expire_due(self) -> None:
        for hold in self.holds.values():
            if hold.due and hold.state in ("pending", "escalated"):
                self._expire_one(hold)

    def due_count(self) -> int:
        return sum(h.due and h.state in ("pending", "escalated") for h in self.holds.values())

    def reserve(
        self,
        key: str,
        fingerprint: str,
        amounts: dict[str, int],
        *,
        zero_ttl: bool,
        armed: bool,
        escalate_above: int,
        open_missing: dict[str, tuple[int, int, int]] | None = None,
        request: str = "",
        shadow: bool = False,
        pool: tuple[str, int, float, int | None] | None = None,
    ) -> tuple[str, str, str, str, tuple[tuple[str, int, int, int], ...]]:
        """`open_missing`: {account: (limit, soft, approval)} opened if missing, only
        when the hold is kept and its amount there is > 0; otherwise left out.
        `request` is kept with a hold that is not denied; a replay keeps the first.
        `shadow`: a deny or escalate is held anyway (pending, armed as asked), even
        above a limit. A check's limit is the effective one (live raises added).
        `pool`: (route, face value, pending priced for, price alone) of a calibrating
        route: sent back (`reprice`, nothing written) unless the route's open set with
        this hold counts at least that many (Kish's effective number), and, priced for
        more than one, if it would escalate (`reprice` "alone": an escalation waits
        outside the set); a kept hold joins it. The thresholds compare the price alone
        when it is above the amount; priced for more than one, it must be given."""
        if pool is not None and pool[2] > 1 and pool[3] is None:
            raise RefError("bad_input")
        alone = (pool[3] or 0) if pool is not None else 0
        held = self.holds.get(key)
        if held is not None:
            if held.fingerprint != fingerprint:
                raise RefError("idempotency_conflict", held.state)
            return "exists", held.decision, held.reason, held.state, held.checks
        specs = open_missing or {}
        for account in amounts:
            if account not in self.accounts and account not in specs:
                raise RefError("unknown_account")
        # Due holds are expired before a calibrating route's reserve (its open set
        # counts them) and before any answer but an admission, which a release (it
        # only makes room) cannot turn around.
        if pool is not None:
            self._expire_due()
        if pool is not None and pool[2] > 1:
            _, s1, s2 = self.open_pool(pool[0])
            s1, s2 = s1 + pool[1], s2 + pool[1] ** 2
            if s2 <= 0 or s1 * s1 / s2 < pool[2]:
                raise RefError("reprice")
        fresh = {
            a: RefAccount(*specs[a]) for a, v in amounts.items() if a not in self.accounts and v
        }
        known = {**self.accounts, **fresh}
        kept = {a: v for a, v in amounts.items() if a in known}

        def checked() -> tuple[tuple[tuple[str, int, int, int], ...], str, str]:
            checks = tuple(
                (a, known[a].effective_limit, known[a].pending + known[a].posted, v)
                for a, v in kept.items()
            )
            return checks, *self._decide(known, checks, escalate_above, alone)

        checks, decision, reason = checked()
        if pool is None and decision != "admit" and self.due_count():
            self._expire_due()
            checks, decision, reason = checked()
        if pool is not None and pool[2] > 1 and decision == "escalate" and not shadow:
            raise RefError("reprice", "alone")
        state = {"admit": "pending", "escalate": "escalated", "deny": "denied"}[decision]
        if shadow:
            state = "pending"
        if state != "denied" and any(used + v > MAX_AMOUNT for _, _, used, v in checks):
            raise RefError("bad_input")  # nothing written: past it the ledger is inexact
        self.holds[key] = RefHold(
            fingerprint,
            state,
            decision,
            reason,
            kept,
            checks,
            armed=armed and state == "pending",
            due=zero_ttl and state != "denied",
            request=request if state != "denied" else "",
            pool=pool[:2] if pool is not None and state != "denied" else None,
        )
        if state != "denied":
            self.accounts.update(fresh)
            self._add(kept, 1, None)
        return "ok", decision, reason, state, checks

    def open_pool(self, route: str) -> tuple[int, int, int]:
        """The route's open holds: how many, their face sum and sum of squares."""
        faces = [
            h.pool[1]
            for h in self.holds.values()
            # an escalated hold joins when approved (ledger/lua/_lib.lua's OPEN)
            if h.pool is not None and h.pool[0] == route and h.state in ("pending", "ambiguous")
        ]
        return len(faces), sum(faces), sum(f * f for f in faces)

    @staticmethod
    def _decide(
        known: dict[str, RefAccount],
        checks: tuple[tuple[str, int, int, int], ...],
        escalate_above: int,
        alone: int = 0,
    ) -> tuple[str, str]:
        """`alone`: a pooled effect's price alone, which the thresholds compare when it
        is above the amount (an agent can lower a pooled price with holds of its own)."""
        for _, limit, used, amount in checks:
            if used > limit:
                return "deny", "over_limit"
            if used + amount > limit:
                return "deny", "budget_exceeded"
        for account, _, used, amount in checks:
            acct = known[account]
            if used + amount > acct.effective_soft:
                return "escalate", "soft_band"
            asked = max(amount, alone)
            if (acct.approval and asked > acct.approval) or (
                escalate_above and asked > escalate_above
            ):
                return "escalate", "approval_threshold"
        return "admit", "within_budget"

    def _hold(self, key: str) -> RefHold:
        if key not in self.holds:
            raise RefError("not_found")
        return self.holds[key]

    def post(self, key: str, amount: int) -> tuple[str, str, frozenset[str]]:
        hold = self._hold(key)
        posted = {a: amount for a in hold.amounts}
        if hold.state == "posted":
            if hold.posted == posted:
                return "exists", "posted", frozenset()
            raise RefError("idempotency_conflict", "posted")
        if hold.state not in ("pending", "ambiguous", "expired"):
            raise RefError("state_conflict", hold.state)
        flags = {"late"} if hold.state == "expired" else set()
        if any(amount > v for v in hold.amounts.values()):
            flags.add("overrun")
        self._add(hold.amounts, -1 if hold.state != "expired" else 0, posted)
        # Settled: the request is done with (the payload key takes the outcome).
        hold.state, hold.posted, hold.claim, hold.request = "posted", posted, 0, ""
        hold.compensated = {a: 0 for a in hold.amounts}
        return "ok", "posted", frozenset(flags)

    def void(self, key: str) -> tuple[str, str, frozenset[str]]:
        hold = self._hold(key)
        if hold.state == "voided":
            return "exists", "voided", frozenset()
        if hold.state not in LIVE:
            raise RefError("state_conflict", hold.state)
        self._add(hold.amounts, -1, None)
        hold.state, hold.claim, hold.request = "voided", 0, ""
        return "ok", "voided", frozenset()

    def mark_ambiguous(self, key: str, claim: int = 0) -> tuple[str, str, frozenset[str]]:
        """`claim`: the caller's retry claim; only the live one it names ends."""
        hold = self._hold(key)
        if hold.state == "ambiguous":
            if claim and claim == hold.claim:
                hold.claim = 0  # the claimed send ended ambiguous again
            return "exists", "ambiguous", frozenset()
        if hold.state not in ("pending", "expired"):
            raise RefError("state_conflict", hold.state)
        flags: frozenset[str] = frozenset()
        if hold.state == "expired":
            self._add(hold.amounts, 1, None)
            flags = frozenset({"late"})
        hold.state = "ambiguous"
        return "ok", "ambiguous", flags

    def retry(self, key: str) -> tuple[str, str, frozenset[str]]:
        """Claim an ambiguous hold for one send; a live claim refuses every other."""
        hold = self._hold(key)
        if hold.state != "ambiguous":
            raise RefError("state_conflict", hold.state)
        if hold.claim:
            raise RefError("in_flight", "ambiguous")
        self.claims += 1
        hold.claim = self.claims
        return "ok", "ambiguous", frozenset()

    def compensate(self, key: str, recovered: int) -> tuple[str, str, frozenset[str]]:
        hold = self._hold(key)
        if hold.state != "posted":
            raise RefError("state_conflict", hold.state)
        if any(recovered > hold.posted[a] - hold.compensated[a] for a in hold.amounts):
            raise RefError("bad_input")
        for account in hold.amounts:
            hold.compensated[account] += recovered
            self.accounts[account].posted -= recovered
        return "ok", "posted", frozenset()

    def approve(self, key: str, *, zero_ttl: bool) -> tuple[str, str, str]:
        """The winner gets the request kept at reserve back (and a new deadline,
        which abstract time does not model)."""
        hold = self._hold(key)
        if hold.state != "escalated":
            raise RefError("state_conflict", hold.state)
        if hold.due:
            self._expire_due()
            raise RefError("state_conflict", hold.state)
        hold.state, hold.armed, hold.due = "pending", True, zero_ttl
        return "ok", "pending", hold.request

    def reject(self, key: str) -> tuple[str, str, frozenset[str]]:
        hold = self._hold(key)
        if hold.state != "escalated":
            raise RefError("state_conflict", hold.state)
        self._add(hold.amounts, -1, None)
        hold.state = "rejected"
        return "ok", "rejected", frozenset()

    def expire(self, key: str) -> tuple[str, str, frozenset[str]]:
        hold = self._hold(key)
        if hold.state not in ("pending", "escalated"):
            raise RefError("state_conflict", hold.state)
        if not hold.due:
            raise RefError("not_due")
        self._expire_one(hold)
        return "ok", hold.state, frozenset()

    def sweep(self) -> int:
        due = self.due_count()
        self._expire_due()
        return due
