"""The ledger's vocabulary: statuses mirroring the scripts' return codes, decisions,
hold states, and the typed results of each operation."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """First element of every script reply (TigerBeetle-style named results)."""

    OK = "ok"
    EXISTS = "exists"
    EXISTS_WITH_DIFFERENT_FINGERPRINT = "exists_with_different_fingerprint"
    EXISTS_WITH_DIFFERENT_AMOUNT = "exists_with_different_amount"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    NOT_DUE = "not_due"
    IN_FLIGHT = "in_flight"
    UNKNOWN_ACCOUNT = "unknown_account"
    BAD_INPUT = "bad_input"
    REPRICE = "reprice"
    RATE_LIMITED = "rate_limited"
    SHORT = "short"
    ESCROWED = "escrowed"


class Verdict(StrEnum):
    """What a reserve decided for its hold. (The gateway's `Decision`,
    gateway/pipeline/decision.py, is its whole record of an effect's admission.)"""

    ADMIT = "admit"
    DENY = "deny"
    ESCALATE = "escalate"


class Reason(StrEnum):
    WITHIN_BUDGET = "within_budget"
    BUDGET_EXCEEDED = "budget_exceeded"
    OVER_LIMIT = "over_limit"
    SOFT_BAND = "soft_band"
    APPROVAL_THRESHOLD = "approval_threshold"
    # Would escalate, but its agent already has as many escalations waiting as its
    # account allows (account.lua's max_escalations): denied, nothing held.
    ESCALATION_CAP = "escalation_cap"
    # Would open more risk-factor accounts this window than its agent's account allows
    # (account.lua's max_new_accounts): denied, nothing opened or held, even in shadow.
    ACCOUNT_CAP = "account_cap"


# An automatic approval's approver: `rule:<rule id>` (approve.lua's ARGV[4]); an
# admin's name has no ':', so no admin can pass for a rule.
RULE_PREFIX = "rule:"

# The decision each reason stands for (a hold record and its journal entry keep only
# the reason; reserve.lua's DECISION).
DECIDED_BY = {
    Reason.WITHIN_BUDGET: Verdict.ADMIT,
    Reason.BUDGET_EXCEEDED: Verdict.DENY,
    Reason.OVER_LIMIT: Verdict.DENY,
    Reason.SOFT_BAND: Verdict.ESCALATE,
    Reason.ESCALATION_CAP: Verdict.DENY,
    Reason.ACCOUNT_CAP: Verdict.DENY,
    Reason.APPROVAL_THRESHOLD: Verdict.ESCALATE,
}


class HoldState(StrEnum):
    PENDING = "pending"
    ESCALATED = "escalated"
    AMBIGUOUS = "ambiguous"
    POSTED = "posted"
    VOIDED = "voided"
    REJECTED = "rejected"
    EXPIRED = "expired"
    DENIED = "denied"

    @property
    def charges_pending(self) -> bool:
        """Whether a hold in this state still holds its amounts as pending."""
        return self in (HoldState.PENDING, HoldState.ESCALATED, HoldState.AMBIGUOUS)


class AccountKind(StrEnum):
    TENANT = "tenant"
    PRINCIPAL = "principal"
    AGENT = "agent"
    FACTOR = "factor"
    # `shadow:<account id>`: the twin of an account that shadow-mode holds are decided
    # and held on, so that they never take room from enforced effects.
    SHADOW = "shadow"


@dataclass(frozen=True, slots=True)
class Pace:
    """A rate on an account: one request every `interval_ms`, bursts running at most
    `slack_ms` ahead of it (interval x (burst - 1)); lua/_lib.lua's rate_step."""

    interval_ms: int
    slack_ms: int = 0

    @classmethod
    def of(cls, per_second: float, burst: int) -> Pace:
        """`per_second` requests a second (at most 1000), `burst` of them at once."""
        interval = max(1, round(1000 / per_second))
        return cls(interval, interval * (burst - 1))

    @property
    def text(self) -> str:
        return f"{self.interval_ms},{self.slack_ms}"


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountSpec:
    """An account's parameters as the ledger keeps them. Amounts in the tenant's minor
    unit; `soft_limit` is the pending + posted above which a hold escalates (equal to
    `limit`: no band)."""

    account: str
    limit: int
    soft_limit: int
    window_ms: int = 0
    approval_threshold: int = 0
    # An agent's account: how many of its holds may wait for a human at once (0: no
    # bound); a reserve that would escalate past it is denied (escalation_cap).
    max_escalations: int = 0
    # An agent's account: how many risk-factor accounts its holds may open per window
    # (0: no bound); a reserve that would open more is denied (account_cap).
    max_new_accounts: int = 0
    # An agent's or a principal's rates: effects (checked by reserve.lua) and reads
    # (lua/rate.lua); None: no rate.
    effect_pace: Pace | None = None
    read_pace: Pace | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StressDetector:
    """A route's stress detector as the ledger keeps it (lua/detector.lua): Page's
    CUSUM for a shift of `shift` x the calm rate, alarming at score `h`, on for `hold`
    ticks of `tick_ms` after an alarm, starting from `warm_requests` calm requests over
    `warm_ticks` ticks (pricing/stress.py)."""

    tick_ms: int
    shift: float
    h: float
    hold: int
    warm_requests: float
    warm_ticks: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StressReading:
    """One request through a route's detector: `on`, price it stressed; the rest as
    pricing.stress.CusumStep has them, with the detector's `tick`, its `score` and
    `calm` rate after it, and whether it turned on (`tripped`) or had turned off
    since the last request (`cleared`), both journaled. `counted` False: a repeat of
    a request the detector has counted, which changed nothing."""

    on: bool
    run: int
    tick: int
    score: float
    calm: float
    alarm: bool
    ended: bool
    ended_at: int
    tripped: bool
    cleared: bool
    counted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Margin:
    """A hold admitted at its stressed price while its route's detector was off, to
    be lowered to `calm` once the detector vouches for `run` (gateway/state/margins.py)."""

    tag: str
    run: int
    calm: int
    hold_id: str

    @property
    def member(self) -> str:
        return f"{self.tag}|{self.run}|{self.calm}|{self.hold_id}"

    @classmethod
    def parse(cls, member: str | bytes) -> Margin:
        text = member.decode() if isinstance(member, bytes) else member
        tag, run, calm, hold_id = text.split("|", 3)
        return cls(tag=tag, run=int(run), calm=int(calm), hold_id=hold_id)


@dataclass(frozen=True, slots=True)
class RouteOutcomes:
    """Compensation outcomes counted for one route (learn.lua), at most one per posted
    hold: how many recovered nothing (failures) and how many recovered some."""

    failures: int
    successes: int


@dataclass(frozen=True, slots=True)
class RouteFactors:
    """Realised residual factors recorded for one route (calibrate.lua), at most one per
    posted hold, in parts per million: count, sum, sum of squares, largest (descending)."""

    n: int
    total_ppm: int
    total_sq_ppm: int
    top_ppm: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Balance:
    account: str
    limit: int
    soft_limit: int
    pending: int
    posted: int
    window_ms: int
    window_start_ms: int
    approval_threshold: int
    overruns: int

    @property
    def used(self) -> int:
        return self.pending + self.posted

    @property
    def available(self) -> int:
        """Negative after a realised overrun: admissions stay blocked until it is >= 0."""
        return self.limit - self.used


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantSnapshot:
    """A tenant's live state as an operator watches it, at Redis time `now_ms`: live
    hold counts by state, the balances of the accounts asked for, and the creation
    and deadline times of its escalated holds and the creation times of its ambiguous
    ones (the queues a human works through)."""

    tenant: str
    now_ms: int
    counts: dict[str, int]
    balances: list[Balance]
    escalated: list[tuple[int, int]]
    ambiguous: list[int]


@dataclass(frozen=True, slots=True)
class AccountCheck:
    """One account as the reserve saw it: `used` is pending + posted before the hold."""

    account: str
    limit: int
    used: int
    amount: int

    @property
    def available(self) -> int:
        return self.limit - self.used

    @property
    def fits(self) -> bool:
        return self.used + self.amount <= self.limit


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Who asked for an effect and what it was, as the journal's reserve entry keeps
    it (so that, once the hold is gone, one can still prove what was paid to whom):
    the route that priced it, the agent and its principal, its face value (minor
    units), the agent's own idempotency key, and the SHA-256 (hex) of the request
    kept with the hold, which the ledger computes (`Ledger.reserve`)."""

    route: str = ""
    agent: str = ""
    principal: str = ""
    face_value: int = 0
    agent_key: str = ""
    request_sha256: str = ""

    def packed(self) -> str:
        """One journal field: `route|agent|principal|face|sha256|key`, each text with
        its '%' and '|' escaped (a route id of an unknown route is the agent's path),
        the digest in unpadded base64url: 43 characters, not 64 hex, in every reserve
        entry kept (issue 12)."""
        texts = (self.route, self.agent, self.principal, self.agent_key)
        route, agent, principal, key = (_escape(text) for text in texts)
        digest = _short_digest(self.request_sha256)
        return f"{route}|{agent}|{principal}|{self.face_value}|{digest}|{key}"

    @classmethod
    def unpacked(cls, text: str) -> Provenance:
        """Also the entries written before the digest was base64url (64 hex)."""
        route, agent, principal, face, digest, key = text.split("|")
        if len(digest) == SHORT_DIGEST_LENGTH:
            digest = base64.urlsafe_b64decode(digest + "=").hex()
        return cls(
            route=_unescape(route),
            agent=_unescape(agent),
            principal=_unescape(principal),
            face_value=int(face or 0),
            agent_key=_unescape(key),
            request_sha256=digest,
        )


# A SHA-256 in unpadded base64url (Provenance.packed).
SHORT_DIGEST_LENGTH = 43


def _short_digest(hex_digest: str) -> str:
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        return hex_digest
    if len(raw) != 32:
        return hex_digest  # none ('': no request kept)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("|", "%7C")


def _unescape(text: str) -> str:
    return text.replace("%7C", "|").replace("%25", "%")


@dataclass(frozen=True, slots=True)
class OpenPool:
    """A calibrating route's holds open now (pricing/calibration.py pools their luck):
    how many, the sum of their face values and of their squares (reserve.lua)."""

    count: int = 0
    face_sum: int = 0
    face_squares: float = 0.0

    def effective(self, face_value: int) -> float:
        """Kish's effective number of these holds and one more of `face_value`:
        (sum v)^2 / sum v^2, at least 1 (one large hold among small ones counts about
        one), computed as reserve.lua computes it, so the two agree to the bit."""
        # Read within what a real set can have (as _lib.lua's kish): the sum of
        # squares is a float that can lose small squares, and the fields can drift
        # from the live holds (an older irrev's script closing a counted hold), so
        # the face sum counts as >= 0 and the squares as >= sum^2 / (count + 1): the
        # number is at most the count with this hold (Cauchy-Schwarz).
        k = float(max(self.count, 0) + 1)
        s1 = float(max(self.face_sum, 0) + face_value)
        s2 = max(self.face_squares, 0.0) + float(face_value) * float(face_value)
        s2 = max(s2, s1 * s1 / k)
        return min(k, max(1.0, s1 * s1 / s2)) if s2 > 0 else 1.0


@dataclass(frozen=True, slots=True)
class PoolTicket:
    """What a reserve of a calibrating route tells the ledger: the route's tag
    (`pool_tag`), the effect's face value, and the number of holds pending at once its
    price assumed (>= 1): the hold is kept only if the open set, with it, is at least
    that large (else `PoolShrank`)."""

    tag: str
    face_value: int
    pending: float = 1.0
    # The price the effect would have alone (pending 1), which the approval
    # thresholds compare when it is above the pooled one (None: the amounts, only
    # when `pending` is 1; a pooled ticket without it is BadInput).
    alone: int | None = None


def pool_tag(route_id: str) -> str:
    """A route's short tag in the ledger: 16 hex digits of the SHA-256 of its id (a
    route id can be 1 KiB; the tag is on every one of its holds)."""
    return hashlib.sha256(route_id.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveRequest:
    """The arguments of one reserve, for batches (see `Ledger.reserve`)."""

    idempotency_key: str
    fingerprint: str
    amounts: Mapping[str, int]
    ttl_ms: int
    escalation_ttl_ms: int = 24 * 3600 * 1000
    armed: bool = True
    escalate_above: int = 0
    request: str = ""
    # Accounts of `amounts` to open if Redis lacks them, only if the hold is kept
    # (admitted or escalated) and holds something on them.
    open_missing: Sequence[AccountSpec] = ()
    # For the journal (its request_sha256 is the ledger's to fill in).
    provenance: Provenance | None = None
    # Shadow mode: a deny or escalate is recorded but the effect is held anyway.
    shadow: bool = False
    # A calibrating route's hold: counted in its open set while open.
    pool: PoolTicket | None = None
    # On an escrow shard (ledger/escrow.py): a refusal for want of room raises
    # ShortOfRoom, nothing written, for the caller to lease room and ask again.
    escrowed: bool = False


@dataclass(frozen=True, slots=True)
class Acks:
    """What a write's WAIT or WAITAOF acknowledged: replicas (None if not asked for)
    and, for WAITAOF, whether the primary fsynced it (1/0; None if not asked for)."""

    replicas: int | None
    fsynced: int | None


NO_ACKS = Acks(None, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveResult:
    status: Status  # OK for a new decision, EXISTS for a replay
    hold_id: str
    decision: Verdict
    reason: Reason
    state: HoldState  # the hold's state now (a replay may find it settled)
    deadline_ms: int
    created_ms: int
    accounts: tuple[AccountCheck, ...]
    # Replicas that acknowledged the write before the reply (WAIT; with WAITAOF,
    # replicas that fsynced it); None if not asked.
    replicas: int | None = None
    # A calibrating route's open set after this decision (None for a replay, or a
    # route that does not calibrate).
    pool: OpenPool | None = None
    # WAITAOF (Ledger's wait_aof): 1 if the primary fsynced the write to its AOF in
    # time, 0 if not; None if not asked.
    fsynced: int | None = None

    @property
    def replayed(self) -> bool:
        return self.status is Status.EXISTS

    @property
    def price(self) -> int:
        return max(check.amount for check in self.accounts)

    @property
    def shadowed(self) -> bool:
        """A new decision held in shadow mode although enforcement would have
        denied or escalated it (`decision` says which). A replay cannot tell: an
        approved escalation is pending too."""
        return (
            self.status is Status.OK
            and self.decision is not Verdict.ADMIT
            and self.state is HoldState.PENDING
        )

    @property
    def binding(self) -> AccountCheck:
        """The account that decided: the first one that did not fit for a denial,
        else the one with the least room left after the hold."""
        for check in self.accounts:
            if not check.fits:
                return check
        return min(self.accounts, key=lambda c: c.available - c.amount)

    @property
    def remaining(self) -> int:
        """Least room left on any account once this hold is counted (if it holds)."""
        held = self.state is not HoldState.DENIED  # a shadow hold holds a would-be deny
        return min(c.available - (c.amount if held else 0) for c in self.accounts)


@dataclass(frozen=True, slots=True)
class AnswerAllowance:
    """What a settlement's outcome is kept within (post, void): `agent`'s allowance of
    kept answer bytes per UTC day, `bytes_per_day`. An outcome that would take the
    agent past it is kept as `short` instead, the same answer with its body left out
    (the result's flags then hold BODY_OMITTED_FLAG): the hold settles either way."""

    agent: str
    bytes_per_day: int
    short: str


# The flag of a settlement whose outcome was kept short (AnswerAllowance).
BODY_OMITTED_FLAG = "body_omitted"


@dataclass(frozen=True, slots=True, kw_only=True)
class TransitionResult:
    status: Status  # OK, or EXISTS when the same transition was already made
    hold_id: str
    state: HoldState
    flags: frozenset[str]
    by: str = ""  # who rejected it (reject) or resolved it by hand (note)
    replicas: int | None = None  # as in ReserveResult
    claim: str = ""  # a won retry claim (Ledger.retry), to pass to mark_ambiguous
    fsynced: int | None = None  # as in ReserveResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """A won approval: the hold is pending again, armed, until `deadline_ms` (Redis's
    clock), and `request` is what was kept with it at reserve, so the approver
    forwards the effect without a second read or its own clock."""

    status: Status
    hold_id: str
    state: HoldState
    by: str
    deadline_ms: int
    request: str
    replicas: int | None = None  # as in ReserveResult
    fsynced: int | None = None  # as in ReserveResult


@dataclass(frozen=True, slots=True)
class Attached:
    """Which hold a keyless call is (Ledger.attach): `hold_id` of its content's
    `generation`; `existing` when that hold was there already (live, or settled within
    the dedupe window), so that reserving it replays it."""

    hold_id: str
    generation: int
    existing: bool


@dataclass(frozen=True, slots=True)
class SweepResult:
    visited: int
    remaining_due: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold:
    hold_id: str
    state: HoldState
    decision: Verdict
    reason: Reason
    fingerprint: str
    armed: bool
    created_ms: int
    deadline_ms: int
    amounts: dict[str, int]
    posted: dict[str, int]
    compensated: dict[str, int]
    flags: frozenset[str]
    ambiguity: str  # why it became ambiguous (e.g. upstream_timeout, deadline)
    by: str  # who approved or rejected it
    request: str  # kept while the hold is live (see Ledger.reserve)
    outcome: str  # the upstream's answer, kept once settled
    # What each account's limit and pending + posted were when it was reserved.
    limits: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    note: str = ""  # the approver's or rejecter's note
    resolved_by: str = ""  # who resolved it by hand after it was ambiguous
    resolution_note: str = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """A tenant's bounded-time rule: `spec` as the admin set it (JSON), live until
    `until_ms` (Redis's clock)."""

    rule_id: str
    spec: str
    until_ms: int
