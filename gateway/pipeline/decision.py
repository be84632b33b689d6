"""The one admission pipeline, for the proxy, MCP calls, approvals and the decision
API: prepare (price, check, derive the hold) -> reserve (one ledger round trip) ->
deliver (through an `Upstream`, settling the hold by what it said), or approve (a
person's or a rule's). Arithmetic lives in pricing/, state changes in ledger/,
delivery behind `Upstream`; these modules only order them. Routers parse requests
into an `Intent` and shape the `Decision` that comes back; nothing here sees an HTTP
request."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from gateway.edge.problems import Problem
from gateway.edge.wire import StoredAnswer, StoredRequest
from gateway.pipeline.approve import approve, auto_approval, rejected_problem
from gateway.pipeline.deliver import answer_by, fire
from gateway.pipeline.prepare import Gate, Prepared, keyed_by_content, read_paced, same_again
from gateway.pipeline.reserve import Shadowed, reserve_priced, shadowed
from gateway.pipeline.upstream import Answer, Upstream
from ledger import (
    RULE_PREFIX,
    Hold,
    HoldState,
    HoldStateConflict,
    PoolTicket,
    ReserveResult,
)
from pricing import (
    AuthenticatedAgent,
    TenantPolicy,
)

log = logging.getLogger("irrev.gateway")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the gateway decided about one held effect, and what came of it: admitted
    (and delivered: `answer`), escalated to a person (`answer` None while they
    decide), a shadow mode's would-be deny or escalation let through (`shadowed`), or
    the replay of an earlier decision (`replayed`: the answer kept with the hold, or
    the same effect sent again). A denial is a refusal (edge/problems.py), not a
    Decision. One record, rendered three ways: HTTP headers (edge/responses.py
    `decision_headers`), the decision API's JSON (routes/holds_api.py), an MCP tool
    result (routes/mcp_server.py)."""

    result: ReserveResult  # the ledger's decision and the numbers behind it
    hold_id: str
    answer: Answer | StoredAnswer | None = None
    shadowed: Shadowed | None = None
    key: str = ""  # the key it is held under (Prepared.agent_key)
    replayed: bool = False
    # The hold's state when its answer was read (a replay may find it settled).
    state: HoldState = HoldState.PENDING
    # Who approved it and why (a rule, or a person before a repeat of the key).
    by: str = ""
    note: str = ""
    # How long its route lets a call that cannot poll wait for a person's decision.
    wait_s: float = 0.0
    # Its route's burst detector: 'on' (held at its stressed price for good), 'margin'
    # (held at its stressed price until the detector vouches for it, then at
    # `calm_price`), or '' (no detector, or a replay).
    stress: str = ""
    calm_price: int = 0

    @property
    def escalated(self) -> bool:
        """Waiting for a person (nothing was delivered, and the hold is escalated)."""
        return self.answer is None and self.state is HoldState.ESCALATED

    @property
    def decision(self) -> str:
        """What happened to the effect: shadow mode admits what it would refuse."""
        return "admit" if self.shadowed is not None else self.result.decision.value

    @property
    def price(self) -> int:
        return self.result.price

    @property
    def remaining(self) -> int:
        return self.result.remaining


def decided(
    result: ReserveResult, prepared: Prepared, answer: Answer | StoredAnswer | None, **more: Any
) -> Decision:
    route = prepared.effect.route
    wait_s = route.escalation_wait_ms / 1000 if route is not None else 0.0
    state = more.pop("state", result.state)
    if not result.replayed:
        more["stress"] = "on" if prepared.stressed else "margin" if prepared.calm_price else ""
        more["calm_price"] = prepared.calm_price
    return Decision(
        result=result,
        hold_id=prepared.hold_id,
        answer=answer,
        key=prepared.agent_key,
        replayed=result.replayed,
        state=state,
        wait_s=wait_s,
        **more,
    )


async def admit(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    upstream: Upstream,
) -> Decision | Answer:
    """The proxy's path: a read goes straight through (its bare Answer); an effect is
    reserved, then fired and settled, or escalated to a human; a repeat of its key
    gets the recorded answer or, for an ambiguous hold, the same effect again under
    the same key."""
    if not prepared.content:
        return await _admit(gate, policy, agent, prepared, upstream)
    prepared = await keyed_by_content(gate, policy, agent, prepared)
    try:
        return await _admit(gate, policy, agent, prepared, upstream)
    except Problem as problem:
        # The key its content gave it, which the agent never sent: a client that can
        # send keys may repeat the call with it.
        problem.extra.setdefault("idempotency_key", prepared.agent_key)
        raise


async def _admit(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    prepared: Prepared,
    upstream: Upstream,
) -> Decision | Answer:
    if not prepared.hold_id:
        paced = read_paced(policy, agent)
        if paced:
            await gate.ledger.pace_reads(policy.tenant, paced)
        return await upstream.deliver(prepared.request, "", answer_by(gate))
    sent = time.monotonic()
    result, prepared, ticket = await reserve_priced(gate, policy, agent, prepared)
    if result.state is HoldState.ESCALATED:
        answer = await escalate(gate, policy, agent, result, ticket)
        return decided(result, prepared, answer)
    if not result.replayed:
        # The hold's life as Redis counts it (deadline - its creation, both Redis
        # time), measured from before the reserve was sent: never later than the
        # deadline, whatever this host's wall clock says.
        expires_at = sent + (result.deadline_ms - result.created_ms) / 1000
        hold_id = prepared.hold_id
        answer = await fire(gate, policy, hold_id, prepared.request, expires_at, upstream)
        return decided(result, prepared, answer, shadowed=shadowed(prepared, result))
    replayed, hold = await _replay(gate, policy, result, prepared, upstream)
    if hold is None:
        return decided(result, prepared, replayed)
    return decided(result, prepared, replayed, state=hold.state, by=hold.by, note=hold.note)


async def escalate(
    gate: Gate,
    policy: TenantPolicy,
    agent: AuthenticatedAgent,
    result: ReserveResult,
    ticket: PoolTicket | None = None,
) -> Answer | None:
    """A new escalation approved at once by a live rule that covers it, if any (its
    effect then forwarded, unless it is decision-only); None while it waits for a
    person, also when a person (or the sweeper) resolved it first."""
    alone = ticket.alone if ticket is not None and ticket.alone is not None else 0
    rule = await auto_approval(gate, policy, agent, result, alone)
    if rule is None:
        return None
    note = f"approved automatically by rule {rule.rule_id}"
    try:
        return await approve(gate, policy, result.hold_id, RULE_PREFIX + rule.rule_id, note)
    except Problem as lost:
        if lost.reason != "escalation_resolved":
            raise
        return None


async def _replay(
    gate: Gate, policy: TenantPolicy, result: ReserveResult, prepared: Prepared, upstream: Upstream
) -> tuple[Answer | StoredAnswer, Hold | None]:
    """The answer to a repeat of a key, and the hold as it was read (who approved it
    and why reach the agent beside the answer)."""
    hold_id, key_name = prepared.hold_id, prepared.key_name
    hold = await gate.ledger.hold(policy.tenant, hold_id)
    if hold is not None and hold.state is HoldState.AMBIGUOUS and hold.request:
        if not upstream.resends:
            # Its server may not deduplicate: sent again, the effect could happen twice.
            # The agent learns what the ledger knows; the reconciler resolves the rest.
            raise still_ambiguous(hold_id, key_name)
        # The first outcome is unknown: retry, with the same Idempotency-Key, so the
        # tool API can deduplicate it (contract 4). One retry at a time (the claim).
        request = StoredRequest.loads(hold.request)
        try:
            return await fire(gate, policy, hold_id, request, None, upstream, key_name), hold
        except HoldStateConflict:
            # Settled between the read and the claim (another retry, the reconciler).
            hold = await gate.ledger.hold(policy.tenant, hold_id)
    return _recorded(hold, result, hold_id, key_name), hold


def _recorded(
    hold: Hold | None, result: ReserveResult, hold_id: str, key_name: str
) -> StoredAnswer:
    """The answer a settled hold keeps for repeats of its key; else the problem its
    state is."""
    if hold is not None and hold.outcome:
        recorded = StoredAnswer.loads(hold.outcome)
        if hold.state is HoldState.VOIDED and recorded.status // 100 == 2:
            # An upstream 2xx never voids: this is the receipt of a void through the
            # holds API, not an answer to give back as the effect's.
            raise Problem(
                409,
                "hold_voided",
                f"this effect's hold was voided, so it was not made; use a new {key_name} "
                "to make it",
                hold=hold_id,
                state=hold.state.value,
            )
        return recorded
    if hold is not None and hold.state is HoldState.AMBIGUOUS:
        raise still_ambiguous(hold_id, key_name)
    raise settled_problem(hold.state if hold else result.state, hold_id, hold)


def still_ambiguous(hold_id: str, key_name: str) -> Problem:
    return Problem(
        502,
        "upstream_ambiguous",
        "whether this effect was made is still unknown; it was not sent again (its server "
        "does not declare that it deduplicates) and stays charged until the reconciler "
        f"learns the outcome. For the result, {same_again(key_name)} later",
        hold=hold_id,
        state=HoldState.AMBIGUOUS.value,
    )


def settled_problem(state: HoldState, hold_id: str, hold: Hold | None = None) -> Problem:
    """The answer a hold in `state` gives a repeat of its key when it kept none; a
    rejection names who rejected it and why (from `hold`)."""
    if state is HoldState.REJECTED:
        return rejected_problem(hold.by if hold else "", hold.note if hold else "", hold_id)
    reasons = {
        HoldState.EXPIRED: (403, "hold_expired", "The hold expired before the effect was made"),
        HoldState.PENDING: (409, "in_flight", "This effect is being made right now"),
    }
    status, reason, detail = reasons.get(
        state, (409, "state_conflict", f"the hold is {state.value}")
    )
    headers = {"Retry-After": "1"} if state is HoldState.PENDING else None
    return Problem(status, reason, detail, headers=headers, hold=hold_id, state=state.value)
