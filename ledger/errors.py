"""Typed ledger errors. Business outcomes (deny, escalate, a replay) are results, not
errors; these are for calls that cannot be carried out, and for the transport."""

from __future__ import annotations

from .records import HoldState, Status


class LedgerError(Exception):
    """Base of every ledger error."""


class BadInput(LedgerError, ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownAccount(LedgerError):
    def __init__(self, tenant: str, account: str) -> None:
        super().__init__(
            f"account {account!r} of tenant {tenant!r} does not exist: create it first"
        )
        self.tenant = tenant
        self.account = account


class HoldNotFound(LedgerError):
    def __init__(self, tenant: str, hold_id: str) -> None:
        super().__init__(f"hold {hold_id!r} of tenant {tenant!r} does not exist")
        self.tenant = tenant
        self.hold_id = hold_id


class IdempotencyConflict(LedgerError):
    """The key was used before for a different request (or a different amount)."""

    def __init__(self, hold_id: str, state: HoldState, detail: str) -> None:
        super().__init__(
            f"idempotency key {hold_id!r} was already used for {detail} (hold is {state}); "
            "use a new key for a new request"
        )
        self.hold_id = hold_id
        self.state = state


class HoldStateConflict(LedgerError):
    """The hold is not in a state that allows the operation: someone else resolved it,
    or it settled. `state` names the outcome; `by` who resolved it, where recorded."""

    def __init__(self, hold_id: str, operation: str, state: HoldState, by: str = "") -> None:
        who = f" by {by}" if by else ""
        super().__init__(f"cannot {operation} hold {hold_id!r}: it is already {state}{who}")
        self.hold_id = hold_id
        self.operation = operation
        self.state = state
        self.by = by


class HoldNotDue(LedgerError):
    def __init__(self, hold_id: str) -> None:
        super().__init__(f"hold {hold_id!r} has not reached its deadline")
        self.hold_id = hold_id


class LedgerUnavailable(LedgerError):
    """Redis could not be reached or answered with an error: fail closed."""


def raise_for_reply(tenant: str, hold_id: str, operation: str, reply: list[object]) -> Status:
    """Map a script's non-success status to its exception; return the status otherwise."""
    status = Status(str(reply[0]))
    if status in (Status.OK, Status.EXISTS):
        return status
    if status is Status.BAD_INPUT:
        raise BadInput(str(reply[1]), str(reply[2]))
    if status is Status.UNKNOWN_ACCOUNT:
        raise UnknownAccount(tenant, str(reply[1]))
    if status is Status.NOT_FOUND:
        raise HoldNotFound(tenant, hold_id)
    if status is Status.NOT_DUE:
        raise HoldNotDue(hold_id)
    state = HoldState(str(reply[1]))
    if status is Status.EXISTS_WITH_DIFFERENT_FINGERPRINT:
        raise IdempotencyConflict(hold_id, state, "a different request")
    if status is Status.EXISTS_WITH_DIFFERENT_AMOUNT:
        raise IdempotencyConflict(hold_id, state, "a post of a different amount")
    raise HoldStateConflict(hold_id, operation, state, str(reply[2]) if len(reply) > 2 else "")
