"""A Ledger's transitions of a hold already held, besides its post (ledger/holds.py,
which group commit shares with reserve): void, retry, ambiguous, compensate,
true-up, shrink, approve, reject, the note of a resolution and expire, each one
script in the tenant's slot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import validate
from .errors import raise_for_reply
from .keys import hold_script_keys
from .records import AnswerAllowance, Approval, HoldState, TransitionResult

if TYPE_CHECKING:
    # Checked as a subclass of LedgerCore, whose calls it uses; at run time a plain
    # mixin, which Ledger lists before LedgerCore.
    from .client import LedgerCore
else:
    LedgerCore = object


class Transitions(LedgerCore):
    """A held hold's transitions but post (a mixin of Ledger)."""

    async def void(
        self,
        tenant: str,
        hold_id: str,
        *,
        outcome: str = "",
        due_only: bool = False,
        allowance: AnswerAllowance | None = None,
    ) -> TransitionResult:
        """Release the hold. `due_only`: only once its deadline has passed (Redis
        time), else HoldNotDue: what a reconciler's "not found" may void. `outcome`
        is kept for repeats within `allowance`, as `post`'s."""
        outcome = validate.blob("outcome", outcome)
        args = [*self._hold_args(hold_id), outcome, *validate.allowance_args(allowance)]
        return await self._transition("void", tenant, hold_id, [*args, "1"] if due_only else args)

    async def retry(self, tenant: str, hold_id: str, window_ms: int) -> TransitionResult:
        """Claim an ambiguous effect for sending it again: the claim and the hold's
        deadline last at least now + `window_ms` (Redis time), so no other retry sends
        it meanwhile and no `void(due_only=True)` overtakes that request. HoldInFlight
        while another retry's claim lives; HoldStateConflict if the hold is no longer
        ambiguous. Either way it must not be sent. The claim (the result's `claim`)
        ends when the hold is posted or voided, or marked ambiguous again by its
        claimer (`mark_ambiguous` with the claim), or lapses. Followed by WAIT /
        WAITAOF when asked for (the result's `replicas`, `fsynced`): a claim
        acknowledged short must not be sent either, as a failover could lose the
        hold's charge (its reserve was written before the claim, which the wait counts)."""
        args = [validate.identifier("hold_id", hold_id), str(validate.amount("window", window_ms))]
        return await self._transition("retry", tenant, hold_id, args, replicated=True)

    async def mark_ambiguous(
        self, tenant: str, hold_id: str, reason: str, claim: str = ""
    ) -> TransitionResult:
        """The effect may have happened: charged until post or void. `claim`: the
        caller's retry claim (`retry`), which ends with this; a hold already ambiguous
        keeps any other claim (only its claimer, or its lapse, ends it)."""
        args = [validate.identifier("hold_id", hold_id), validate.identifier("reason", reason)]
        if claim:
            args.append(validate.identifier("claim", claim))
        return await self._transition("ambiguous", tenant, hold_id, args)

    async def compensate(
        self, tenant: str, hold_id: str, recovered: int | Mapping[str, int]
    ) -> TransitionResult:
        args = [*self._hold_args(hold_id), *validate.per_account(recovered)]
        return await self._transition("compensate", tenant, hold_id, args)

    async def true_up(self, tenant: str, hold_id: str, realised: int) -> TransitionResult:
        """A posted effect's realised residual: the hold's net charge (posted minus
        compensated) becomes `realised` on every account; above what the hold held
        it is an overrun, posted and flagged. 'exists' if it already was."""
        args = [*self._hold_args(hold_id), str(validate.amount("realised", realised))]
        return await self._transition("trueup", tenant, hold_id, args, replicated=True)

    async def shrink(self, tenant: str, hold_id: str, most: int) -> TransitionResult:
        """Lower what a live hold charges each of its accounts to at most `most`
        (lua/shrink.lua): a stress margin released. 'exists' if it charged no more;
        HoldStateConflict once it is settled."""
        args = [validate.identifier("hold_id", hold_id), str(validate.amount("most", most))]
        return await self._transition("shrink", tenant, hold_id, args)

    async def approve(
        self, tenant: str, hold_id: str, approver: str, *, ttl_ms: int, note: str = ""
    ) -> Approval:
        """Consume-once: raises HoldStateConflict naming the outcome for every loser.
        The winner gets the hold's new deadline and its kept request. `note` (the
        approver's why) is kept with the hold and journaled."""
        args = [
            *self._hold_args(hold_id),
            str(validate.ttl("ttl_ms", ttl_ms)),
            validate.identifier("approver", approver),
            validate.note(note),
        ]
        keys = hold_script_keys(validate.tenant_id(tenant), hold_id)
        reply, acked = await self._on_hold("approve", tenant, hold_id, keys, args)
        status = raise_for_reply(tenant, hold_id, "approve", reply)
        state, by, deadline_ms, request = reply[1:5]
        return Approval(
            status=status,
            hold_id=hold_id,
            state=HoldState(state),
            by=str(by),
            deadline_ms=int(deadline_ms),
            request=str(request),
            replicas=acked.replicas,
            fsynced=acked.fsynced,
        )

    async def reject(
        self, tenant: str, hold_id: str, approver: str, *, note: str = ""
    ) -> TransitionResult:
        args = [
            *self._hold_args(hold_id),
            validate.identifier("approver", approver),
            validate.note(note),
        ]
        return await self._transition("reject", tenant, hold_id, args)

    async def note_resolution(
        self, tenant: str, hold_id: str, state: HoldState, admin: str, note: str
    ) -> TransitionResult:
        """Journal who resolved an ambiguous hold by hand (after posting or voiding
        it) and why, once per hold: 'exists' if it was journaled before (`by` says
        by whom)."""
        args = [
            validate.identifier("hold_id", hold_id),
            state.value,
            validate.identifier("admin", admin),
            validate.note(note),
        ]
        return await self._transition("note", tenant, hold_id, args)

    async def expire(self, tenant: str, hold_id: str) -> TransitionResult:
        return await self._transition("expire", tenant, hold_id, self._hold_args(hold_id))
