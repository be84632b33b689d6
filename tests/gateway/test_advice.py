"""What a model reads of a refusal (gateway/edge/advice.py), on both transports: every
reason code the gateway can answer is rendered the same way as HTTP problem+json and
as an MCP tool result, ends on its next step and says whether repeating helps; and
no model text carries an amount in minor units (those stay in structured fields)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from mcp.types import TextContent

from gateway.edge.advice import NEXT_STEPS, Retry, account_words, escalation_sentence, units_of
from gateway.edge.problems import Problem
from gateway.pipeline.approve import rejected_problem
from gateway.pipeline.prepare import cap_problem
from gateway.pipeline.reserve import refusal
from gateway.routes.mcp_results import refused
from ledger import AccountCheck, HoldState, Reason, ReserveResult, Status, Verdict
from pricing import TenantPolicy
from pricing.errors import PerEffectCapExceeded
from pricing.loader import load_policy_text
from tests.gateway.servers import EXAMPLES
from tests.test_docs import documented_reasons

# Amount members of a refusal, in minor units: none of them may appear in its text.
AMOUNT_FIELDS = ("price", "limit", "available", "face_value", "cap")
DIGIT_RUN = re.compile(r"[0-9][0-9,]*")
# 2026-12-02T10:00:00Z, Redis's clock for the reserves below.
NOW_MS = 1_796_205_600_000


@pytest.fixture(scope="module")
def policy() -> TenantPolicy:
    return load_policy_text((EXAMPLES / "procurement.yaml").read_text(), "procurement.yaml")


def minor_amounts(fields: dict[str, Any]) -> set[str]:
    return {str(fields[f]) for f in AMOUNT_FIELDS if isinstance(fields.get(f), int)}


def assert_for_a_model(text: str, fields: dict[str, Any]) -> None:
    """No digit run of `text` (thousands separators dropped) is one of the refusal's
    minor-unit amounts."""
    runs = {run.replace(",", "") for run in DIGIT_RUN.findall(text)}
    leaked = runs & minor_amounts(fields)
    assert not leaked, f"minor units {leaked} in model text: {text!r}"


def both_transports(problem: Problem) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The problem+json body an HTTP agent gets, and the MCP tool result's structured
    content and text."""
    http = json.loads(bytes(problem.response().body))
    result = refused(problem, "")
    block = result.content[0]
    assert isinstance(block, TextContent), block
    text = block.text
    assert result.structured_content is not None
    return http, result.structured_content, text


def test_every_documented_reason_has_a_next_step() -> None:
    assert set(NEXT_STEPS) == documented_reasons()


@pytest.mark.parametrize("reason", sorted(documented_reasons()))
def test_every_reason_reads_the_same_on_both_transports(reason: str) -> None:
    problem = Problem(400, reason, "what was wrong")
    http, structured, text = both_transports(problem)
    retry, step = NEXT_STEPS[reason]
    assert http["detail"] == structured["detail"] == f"what was wrong. {step}"
    said = (
        "irrev cannot tell yet whether this call took effect"
        if retry is Retry.SAME_CALL
        else ("irrev did not make this call")
    )
    assert text == f"{said}: {http['detail']}"
    assert http["retry"] == structured["retry"] == retry.value
    # Kept for a repeat (a stored answer read back whole): told once, not twice.
    kept = Problem(400, reason, http["detail"])
    assert json.loads(bytes(kept.response().body))["detail"] == http["detail"]


def reserve(
    policy: TenantPolicy, reason: Reason, *checks: tuple[str, int, int, int]
) -> ReserveResult:
    decision = {
        Reason.BUDGET_EXCEEDED: Verdict.DENY,
        Reason.OVER_LIMIT: Verdict.DENY,
        Reason.SOFT_BAND: Verdict.ESCALATE,
        Reason.APPROVAL_THRESHOLD: Verdict.ESCALATE,
    }[reason]
    state = HoldState.DENIED if decision is Verdict.DENY else HoldState.ESCALATED
    accounts = tuple(AccountCheck(*check) for check in checks)
    return ReserveResult(
        status=Status.OK,
        hold_id="h1",
        decision=decision,
        reason=reason,
        state=state,
        deadline_ms=0,
        created_ms=NOW_MS,
        accounts=accounts,
    )


def test_a_budget_refusal_says_what_fits_and_when_it_renews(policy: TenantPolicy) -> None:
    # The supplier cap has 2,500.5 USD of 100,000 left; the order is priced 3,000 USD on
    # a face value of 5,000 USD: about 4,167.5 USD would fit.
    result = reserve(
        policy,
        Reason.BUDGET_EXCEEDED,
        ("tenant:acme", 250_000_000_000, 1_000_000_000, 3_000_000_000),
        ("factor:supplier:acme-steel", 100_000_000_000, 97_499_500_000, 3_000_000_000),
    )
    problem = refusal(policy, result, "h1", 5_000_000_000)
    http, _, text = both_transports(problem)
    assert_for_a_model(text, http)
    assert_for_a_model(http["detail"], http)
    assert "the cap on supplier acme-steel has 2,500.5 USD of its 100,000 USD left" in text
    assert "a call of about 4,167.5 USD or less would fit now" in text
    assert "The budget renews at 2026-12-03 00:00:00 UTC" in text
    assert http["renews_at"] == "2026-12-03T00:00:00.000Z"
    assert (http["price"], http["available"]) == (3_000_000_000, 2_500_500_000)
    assert http["retry"] == Retry.LATER.value


def test_an_account_over_its_limit_says_so(policy: TenantPolicy) -> None:
    result = reserve(
        policy, Reason.OVER_LIMIT, ("principal:procurement", 200_000_000_000, 201_000_000_000, 7)
    )
    http, _, text = both_transports(refusal(policy, result, "h1", 7))
    said = "Nothing more is admitted on procurement's budget (the principal this agent acts for)"
    assert said in text
    assert_for_a_model(text, http)


def test_a_cap_refusal_is_in_major_units(policy: TenantPolicy) -> None:
    exc = PerEffectCapExceeded("buyer-01", 3_000_000_000_000, 2_500_000_000_000)
    http, _, text = both_transports(cap_problem(policy, exc))
    assert "3,000,000 USD" in text and "2,500,000 USD" in text, text
    assert (http["face_value"], http["cap"]) == (3_000_000_000_000, 2_500_000_000_000)
    assert_for_a_model(text, http)
    assert "split nothing" not in text


@pytest.mark.parametrize("reason", [Reason.SOFT_BAND, Reason.APPROVAL_THRESHOLD])
def test_an_escalation_says_why_it_waits_in_major_units(
    policy: TenantPolicy, reason: Reason
) -> None:
    result = reserve(
        policy, reason, ("agent:buyer-01", 100_000_000_000, 70_000_000_000, 15_000_000_000)
    )
    text = escalation_sentence(units_of(policy), result, "acme.h1")
    assert "priced 15,000 USD" in text and "Nothing was done yet" in text
    if reason is Reason.SOFT_BAND:
        assert "this agent's own budget (buyer-01) close to its 100,000 USD limit" in text
    assert_for_a_model(text, {"price": 15_000_000_000, "limit": 100_000_000_000})


def test_a_rejection_carries_who_and_why() -> None:
    http, structured, text = both_transports(rejected_problem("alice", "not this quarter"))
    assert 'A person (alice) rejected this call, saying: "not this quarter"' in text
    assert (structured["by"], structured["note"]) == ("alice", "not this quarter")
    assert http["retry"] == Retry.NO.value


@pytest.mark.parametrize(
    ("account", "words"),
    [
        ("tenant:acme", "the organisation's budget"),
        ("principal:procurement", "procurement's budget (the principal this agent acts for)"),
        ("agent:buyer-07", "this agent's own budget (buyer-07)"),
        ("factor:recipient:erin-a", "the cap on recipient erin-a"),
        ("factor:hot", "the cap on hot"),
    ],
)
def test_accounts_are_named_for_people(account: str, words: str) -> None:
    assert account_words(account) == words
