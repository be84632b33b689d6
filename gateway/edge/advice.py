"""What a model reads when the gateway does not make its effect: one sentence of what
happened, in the tenant's major units with the currency and accounts named for
people, then what to do next and whether repeating the call can help. Both transports
read it: an HTTP refusal's problem+json `detail` (and `retry`), an MCP tool result's
text (and `structuredContent.retry`). Minor-unit integers stay in the structured
fields, for programs; no model text carries them (tests/gateway/test_advice.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ledger import RULE_PREFIX, Reason, ReserveResult
from pricing import TenantPolicy, money_text, rfc3339


class Retry(StrEnum):
    """Whether the same call can fare better, for a program deciding what to do."""

    NO = "no"  # it will be refused again: do not repeat it
    LATER = "later"  # it may be admitted later (a budget renews, a service recovers)
    SAME_CALL = "same_call"  # repeat the very same call (same key or arguments) to learn more
    FIX = "fix"  # the request itself is wrong: change it first


# Every reason code an agent, an admin or a settler can be answered with
# (docs/policy.md's table), with the next step its refusal ends on.
_NOT_AGAIN = "Repeating the same call will not help."
_FIX = "Correct the request and send it again."
_LATER = "The same call may succeed later."
_ASK = "Ask a person who administers this organisation's policy if it should be allowed."
NEXT_STEPS: dict[str, tuple[Retry, str]] = {
    "unauthenticated": (Retry.FIX, "Check the credential configured for this agent."),
    "bad_authorization": (Retry.FIX, _FIX),
    "insufficient_role": (Retry.NO, "An admin with a higher role must do this."),
    "operator_only": (Retry.NO, "An operator of the gateway must make this change."),
    "unknown_tenant": (Retry.FIX, "Name a tenant this gateway serves."),
    "not_found": (Retry.NO, _NOT_AGAIN),
    "unknown_agent": (Retry.FIX, "Add the agent to the tenant's policy, or name one it has."),
    "key_not_found": (Retry.FIX, "List the tenant's keys to find the key's id."),
    "admin_name_in_policy": (
        Retry.FIX,
        "Name the key after the person who will hold it, or let that admin create it.",
    ),
    "key_revoked": (Retry.NO, "A revoked key stays revoked: create a new key."),
    "key_expired": (Retry.NO, "Create a new key."),
    "method_not_allowed": (Retry.FIX, _FIX),
    "unknown_route": (Retry.NO, f"{_NOT_AGAIN} {_ASK}"),
    "route_alias": (Retry.FIX, "Call the route by its listed path, exactly as written."),
    "route_not_allowed": (Retry.NO, f"{_NOT_AGAIN} {_ASK}"),
    "agent_suspended": (
        Retry.NO,
        f"{_NOT_AGAIN} Stop making calls and tell the user an operator suspended this agent.",
    ),
    "per_effect_cap": (
        Retry.NO,
        "Do not split it into smaller calls to get under the cap; ask a person to make it "
        "or to raise the cap.",
    ),
    "budget_exceeded": (Retry.LATER, "Repeating it now will not help."),
    "account_cap": (
        Retry.LATER,
        "Calls to counterparties this agent already used this window still work; new ones "
        "wait for the next window.",
    ),
    "rate_limited": (Retry.LATER, "Slow down: send fewer requests a second."),
    "escalation_cap": (
        Retry.LATER,
        "Wait until a person has decided some of them; repeating it now will not help.",
    ),
    "in_process_route": (Retry.FIX, "Ask for a hold at /v1/holds and make the call yourself."),
    "route_is_proxied": (Retry.FIX, "Call the tool through the gateway's /tools/ path."),
    "no_upstream": (Retry.NO, f"{_NOT_AGAIN} {_ASK}"),
    "settlement_forbidden": (Retry.NO, _NOT_AGAIN),
    "not_compensable": (Retry.NO, _NOT_AGAIN),
    "escalation_rejected": (
        Retry.NO,
        "It was not made. Do not repeat it; tell the user why, or change what you ask for.",
    ),
    "escalation_expired": (
        Retry.LATER,
        "It was not made. Make the call again if it is still wanted: it goes to a person again.",
    ),
    "hold_expired": (Retry.LATER, "It was not made; make the call again if it is still wanted."),
    "idempotency_key_required": (
        Retry.FIX,
        "Send the same key with every retry of one effect and a new key for a new effect.",
    ),
    "bad_idempotency_key": (Retry.FIX, _FIX),
    "bad_json": (Retry.FIX, _FIX),
    "bad_header": (Retry.FIX, _FIX),
    "bad_form": (Retry.FIX, _FIX),
    "bad_query": (Retry.FIX, _FIX),
    "method_override": (Retry.FIX, _FIX),
    "undeclared_query_parameter": (Retry.FIX, "Send only the parameters the route declares."),
    "undeclared_field": (Retry.FIX, "Send only the fields the tool declares."),
    "ambiguous_field": (Retry.FIX, "Send each field once, in one place."),
    "unsupported_media_type": (Retry.FIX, _FIX),
    "body_too_large": (Retry.FIX, "Send a smaller request."),
    "body_too_complex": (Retry.FIX, "Send a smaller, simpler request."),
    "too_many_in_flight": (Retry.LATER, "Send it again once an earlier request was answered."),
    "body_timeout": (Retry.LATER, "Send the request again, all at once."),
    "bad_request": (Retry.FIX, _FIX),
    "bad_amount": (Retry.FIX, _FIX),
    "bad_risk_factor": (Retry.FIX, _FIX),
    "currency_mismatch": (Retry.FIX, _FIX),
    "amount_above_price": (Retry.FIX, _FIX),
    "amount_above_face_value": (Retry.FIX, _FIX),
    "bad_input": (Retry.FIX, _FIX),
    "unknown_account": (Retry.LATER, "The gateway is reloading its policy; try again shortly."),
    "bad_rule": (Retry.FIX, _FIX),
    "invalid_policy": (Retry.FIX, "Correct the policy and upload it again; nothing was applied."),
    "base_required": (Retry.FIX, "Nothing was applied."),
    "bad_if_match": (Retry.FIX, "Nothing was applied."),
    "if_match_without_digest": (Retry.FIX, "Nothing was applied."),
    "unknown_version": (Retry.FIX, "Nothing was applied."),
    "version_forgotten": (Retry.FIX, "Nothing was applied."),
    "policy_conflict": (Retry.FIX, "Nothing was applied."),
    "idempotency_conflict": (
        Retry.FIX,
        "Use a new key for a new effect; repeat the first request to learn its outcome.",
    ),
    "in_flight": (Retry.SAME_CALL, "Repeat the same call in a moment to get its result."),
    "state_conflict": (Retry.NO, _NOT_AGAIN),
    "escalation_resolved": (Retry.NO, _NOT_AGAIN),
    "agent_suspended_escalation": (Retry.FIX, "Nothing was applied."),
    "hold_voided": (Retry.LATER, "It was not made; make it again as a new call if still wanted."),
    "upstream_ambiguous": (
        Retry.SAME_CALL,
        "Do not make it as a new call: repeat the same call later to learn what happened.",
    ),
    "upstream_unreachable": (Retry.LATER, "Nothing was done; the same call may succeed later."),
    "ledger_unavailable": (Retry.LATER, "Nothing was done; the same call may succeed shortly."),
    "archived_hold_missing": (
        Retry.NO,
        "Nothing was done: this call's idempotency key was used before and its record is "
        "lost. Do not send it again; tell a person, and use a new key only if they confirm "
        "the effect did not happen.",
    ),
    "ledger_migrating": (
        Retry.LATER,
        "Nothing was done: the budget ledger is moving to another server. Send the same "
        "call again in a few seconds.",
    ),
    "not_replicated": (Retry.LATER, _LATER),
    "not_fsynced": (Retry.LATER, _LATER),
    "hold_deadline": (Retry.LATER, "Nothing was done; the same call may succeed later."),
    "internal_error": (Retry.LATER, "Nothing was admitted; the same call may succeed later."),
}


# The next step of a call that may have been made, held under a key its caller did
# not send and cannot repeat (no key, on a route whose identical calls are each an
# effect of their own: `dedupe_window: 0`): repeating it would make it again.
UNREPEATABLE = (
    Retry.NO,
    "It may have been made, so do not make this call again: an identical call would be a "
    "new one and could make it twice. Check first whether it was made (read what it "
    "changes, or list what exists).",
)


def next_step(reason: str, repeatable: bool = True) -> tuple[Retry, str]:
    """The refusal's retry hint and closing sentence (an unlisted code says nothing
    it does not know). `repeatable`: whether repeating the call reaches this one, as
    it does with the same key or, keyed by its content, the same arguments."""
    step = NEXT_STEPS.get(reason, (Retry.NO, ""))
    if not repeatable and step[0] is Retry.SAME_CALL:
        return UNREPEATABLE
    return step


def told(detail: str, reason: str, repeatable: bool = True) -> str:
    """The whole model text of a refusal: what happened, then the next step."""
    step = next_step(reason, repeatable)[1]
    detail = detail.strip()
    if detail and not detail.endswith((".", "!", "?")):
        detail += "."
    if not step or detail.endswith(step):  # a kept refusal, told already
        return detail
    return f"{detail} {step}".strip()


def account_words(account: str) -> str:
    """An account as a person would name it: `factor:recipient:erin-a` is "the cap on
    recipient erin-a", `principal:procurement` "procurement's budget"."""
    kind, _, name = account.partition(":")
    if kind == "tenant":
        return "the organisation's budget"
    if kind == "principal":
        return f"{name}'s budget (the principal this agent acts for)"
    if kind == "agent":
        return f"this agent's own budget ({name})"
    if kind == "factor":
        what, _, which = name.partition(":")
        return f"the cap on {what} {which}" if which else f"the cap on {what}"
    return account


def next_window(now_ms: int, window_ms: int) -> int:
    """When the budget window that holds `now_ms` (Redis's clock) gives way to the
    next: windows are aligned to UTC."""
    return now_ms - now_ms % window_ms + window_ms


def renews_at(now_ms: int, window_ms: int) -> str:
    """next_window for a sentence: `2026-12-03 00:00:00 UTC`."""
    return rfc3339(next_window(now_ms, window_ms)).replace("T", " ").replace(".000Z", " UTC")


@dataclass(frozen=True)
class Units:
    """How a tenant's amounts and windows read: its currency, minor units per major
    unit, and budget window."""

    currency: str
    scale: int
    window_ms: int

    def money(self, minor: int) -> str:
        return money_text(minor, self.scale, self.currency)


def units_of(policy: TenantPolicy) -> Units:
    return Units(policy.catalog.currency, policy.scale, policy.document.window_ms)


def budget_refusal(units: Units, result: ReserveResult, face_value: int) -> str:
    """Why a reserve was denied, what would fit now and when the budget renews."""
    binding = result.binding
    who = account_words(binding.account)
    limit = units.money(binding.limit)
    if binding.available < 0 or result.reason is Reason.OVER_LIMIT:
        said = (
            f"Nothing more is admitted on {who}: it is already above its {limit} limit (an "
            "effect cost more than it was priced), until it is back under"
        )
    else:
        left = units.money(binding.available)
        said = (
            f"This call is priced {units.money(result.price)}, and {who} has {left} of its "
            f"{limit} left this window"
        )
        if binding.available > 0 and binding.amount > 0 and face_value > 0:
            # Prices are proportional to the amount on all but calibrating routes, where
            # this is near: hence "about".
            fits = binding.available * face_value // binding.amount
            said += f"; a call of about {units.money(fits)} or less would fit now"
    renewal = renews_at(result.created_ms, units.window_ms)
    return f"{said}. The budget renews at {renewal}, and grows as pending effects settle"


def escalation_sentence(units: Units, result: ReserveResult, escalation: str) -> str:
    """Why an effect waits for a person, and that nothing was done yet."""
    price = units.money(result.price)
    if result.reason is Reason.SOFT_BAND:
        fullest = max(
            result.accounts, key=lambda c: (c.used + c.amount) / c.limit if c.limit else 0.0
        )
        why = (
            f"it would take {account_words(fullest.account)} close to its "
            f"{units.money(fullest.limit)} limit"
        )
    else:
        why = "its price is above what may be spent without a person's approval"
    return (
        f"This call, priced {price}, waits for a person's approval (escalation "
        f"{escalation}): {why}. Nothing was done yet"
    )


def rejection(by: str, note: str) -> str:
    """A person's rejection, in their words."""
    said = f"A person ({by}) rejected this call" if by else "A person rejected this call"
    return f'{said}, saying: "{note}"' if note else said


def approval(by: str, note: str) -> str:
    """A person's approval, in their words, beside the tool's result."""
    if by.startswith(RULE_PREFIX):
        return f"Approved automatically by the operators' rule {by.removeprefix(RULE_PREFIX)}."
    said = f"A person ({by}) approved this call" if by else "A person approved this call"
    return f'{said}, saying: "{note}".' if note else f"{said}."


def duration_text(ms: int) -> str:
    """`600000` -> `10 minutes`: a policy's duration for a sentence."""
    for unit_ms, name in ((86_400_000, "day"), (3_600_000, "hour"), (60_000, "minute")):
        if ms >= unit_ms and ms % unit_ms == 0:
            count = ms // unit_ms
            return f"{count} {name}{'s' if count != 1 else ''}"
    return f"{ms / 1000:g} seconds"
