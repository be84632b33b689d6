"""irrev/client.py against a real `irrev serve` in front of a payments API that pays
every request (tests/clients/conftest.py): form bodies, replays, the gateway's own
sentence for the model with its numbers beside it, escalations that do not hold an
agent for long and are picked up again by the same key, a human's name and note, and
the framework adapters' message when their extra is missing."""

from __future__ import annotations

import asyncio
import json
import string
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from irrev.client import WAIT_S, IrrevClient, Outcome, step_key
from irrev.langchain import http_tool

from .conftest import Payments, fresh

SIX_THOUSAND_USD = 600000  # cents: a payout above treasury's 5,000 USD approval threshold


def charge(customer: str, cents: int = 1999) -> dict[str, str | int]:
    return {"customer": customer, "amount": cents, "currency": "usd"}


def payout(destination: str) -> dict[str, str | int]:
    return {"destination": destination, "amount": SIX_THOUSAND_USD, "currency": "usd"}


async def test_a_form_body_is_one_payment_and_its_repeat_says_replayed(
    payments: Payments, client: IrrevClient
) -> None:
    customer, key = fresh("cus"), fresh("call")
    first = await client.call("payments", "POST", "/v1/charges", key, form=charge(customer))
    again = await client.call("payments", "POST", "/v1/charges", key, form=charge(customer))
    assert first.ok and first.status == 200 and not first.replayed, first
    assert again.ok and again.replayed and again.data == first.data, again
    assert again.text == first.text  # a resumed run reaches the state a first run would
    made = await payments.made(customer=customer)
    assert [p["amount"] for p in made] == ["1999"], made
    assert made[0]["idempotency_key"].startswith("irrev-")  # the gateway's key, not ours


async def test_a_json_body_on_a_form_route_is_refused_and_both_are_never_sent(
    payments: Payments, client: IrrevClient
) -> None:
    customer = fresh("cus")
    as_json = await client.call(
        "payments", "POST", "/v1/charges", fresh("call"), json_body=charge(customer)
    )
    assert not as_json.ok and as_json.status == 415, as_json
    with pytest.raises(ValueError, match="not both"):
        await client.call(
            "payments", "POST", "/v1/charges", "k", json_body={}, form=charge(customer)
        )
    assert await payments.made(customer=customer) == []


async def test_a_refusal_is_the_gateways_detail_with_its_numbers_beside_it(
    payments: Payments, client: IrrevClient
) -> None:
    """Three charges of 1,500 USD to one customer: the third is priced past its 500 USD
    account. The model reads the gateway's detail as it is, no minor-unit figures
    after it; programs get them."""
    customer = fresh("cus")
    for _ in range(3):
        outcome = await client.call(
            "payments", "POST", "/v1/charges", fresh("call"), form=charge(customer, 150000)
        )
    assert not outcome.ok and outcome.status == 403 and outcome.reason == "budget_exceeded"
    detail = outcome.data["detail"]
    assert outcome.text == f"The payments call was not made (budget_exceeded): {detail}"
    figures = outcome.figures
    assert (figures.price, figures.limit, figures.available) == (
        outcome.data["price"],
        outcome.data["limit"],
        outcome.data["available"],
    )
    assert figures.limit == 500 * 10**6 and figures.currency == "USD"
    assert figures.limit_text == "500 USD" and figures.limit_text in outcome.text
    assert str(figures.price) not in outcome.text  # minor units are for programs
    assert len(await payments.made(customer=customer)) == 2


async def test_an_escalation_returns_soon_and_the_same_key_picks_it_up(
    payments: Payments,
) -> None:
    """With the default wait, nobody deciding: an `escalated` Outcome within WAIT_S
    (bounded here at 30 s: a failure, never a measurement). The same key again is the
    same escalation, never a second; once approved, it is the payout, made once."""
    destination, key = fresh("acct"), fresh("call")
    client = payments.client("payouts-01", pause_s=1.0)
    try:
        waited = await asyncio.wait_for(
            client.call("payments", "POST", "/v1/transfers", key, form=payout(destination)), 30
        )
        assert client.wait_s == WAIT_S <= 5
        assert waited.reason == "escalated" and waited.escalation, waited
        assert waited.figures.price_text == "6,000 USD", waited.figures
        assert "waits for a human's approval" in waited.text and "6,000 USD" in waited.text
        client.wait_s = 0
        again = await client.call(
            "payments", "POST", "/v1/transfers", key, form=payout(destination)
        )
        assert again.reason == "escalated" and again.escalation == waited.escalation, again
        assert await payments.made(destination=destination) == []
        approved = await payments.decide(waited.escalation, "approve")
        assert approved.status_code == 200, approved.text
        done = await client.call("payments", "POST", "/v1/transfers", key, form=payout(destination))
    finally:
        await client.aclose()
    assert done.ok and done.replayed and done.data["destination"] == destination, done
    assert len(await payments.made(destination=destination)) == 1


async def decide_once_waiting(
    payments: Payments, destination: str, verdict: str, note: str
) -> None:
    """An operator decides the escalation of the payout to `destination` once it
    waits in the queue (within 30 s), with `note` as the reason."""
    url = f"/v1/admin/tenants/{payments.tenant.id}/escalations"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(base_url=payments.gateway.url, trust_env=False) as http:
        while time.monotonic() < deadline:
            queue = (await http.get(url, headers=payments.gateway.admin)).json()["escalations"]
            for item in queue:
                held = await http.get(
                    f"{url.rsplit('/', 1)[0]}/holds/{item['hold']}",
                    headers=payments.gateway.admin,
                )
                if destination in held.json().get("body", ""):
                    decided = await payments.decide(item["escalation"], verdict, note)
                    assert decided.status_code == 200, decided.text
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"no escalation of a payout to {destination} appeared")


async def wait_and_decide(payments: Payments, verdict: str, note: str) -> tuple[Outcome, str]:
    """A payout that escalates, awaited by the client while an operator decides it."""
    destination = fresh("acct")
    client = payments.client("payouts-01", wait_s=30)
    try:
        outcome, _ = await asyncio.gather(
            client.call(
                "payments", "POST", "/v1/transfers", fresh("call"), form=payout(destination)
            ),
            decide_once_waiting(payments, destination, verdict, note),
        )
    finally:
        await client.aclose()
    return outcome, destination


async def test_a_rejection_names_who_and_keeps_their_note_in_the_text(payments: Payments) -> None:
    note = "new accounts get at most 1,000 USD a day; send 1,000 USD now"
    outcome, destination = await wait_and_decide(payments, "reject", note)
    assert not outcome.ok and outcome.reason == "escalation_rejected", outcome
    assert (outcome.by, outcome.note) == ("operator:ops", note)
    assert note in outcome.text and "operator:ops" in outcome.text, outcome.text
    assert await payments.made(destination=destination) == []


async def test_an_approval_names_who_and_their_note_beside_the_tools_answer(
    payments: Payments,
) -> None:
    note = "checked with the account owner by phone"
    outcome, destination = await wait_and_decide(payments, "approve", note)
    assert outcome.ok and outcome.data["destination"] == destination, outcome
    assert (outcome.by, outcome.note) == ("operator:ops", note)
    assert outcome.text.startswith("A human approved the payments call.")
    assert note in outcome.text and json.dumps(outcome.data) in outcome.text
    assert len(await payments.made(destination=destination)) == 1


async def test_a_repeat_of_a_rejected_key_names_who_and_why(payments: Payments) -> None:
    note = "not this quarter"
    destination, key = fresh("acct"), fresh("call")
    client = payments.client("payouts-01", wait_s=0)
    try:
        waiting = await client.call(
            "payments", "POST", "/v1/transfers", key, form=payout(destination)
        )
        assert waiting.escalation
        assert (await payments.decide(waiting.escalation, "reject", note)).status_code == 200
        again = await client.call(
            "payments", "POST", "/v1/transfers", key, form=payout(destination)
        )
    finally:
        await client.aclose()
    assert again.reason == "escalation_rejected", again
    assert (again.by, again.note) == ("operator:ops", note)


async def test_a_repeat_of_an_escalated_key_says_replayed(payments: Payments) -> None:
    destination, key = fresh("acct"), fresh("call")
    client = payments.client("payouts-01", wait_s=0)
    try:
        first = await client.call(
            "payments", "POST", "/v1/transfers", key, form=payout(destination)
        )
        again = await client.call(
            "payments", "POST", "/v1/transfers", key, form=payout(destination)
        )
    finally:
        await client.aclose()
    assert again.escalation == first.escalation and not first.replayed
    assert again.replayed


class Charge(BaseModel):
    customer: str
    amount: int
    currency: str


async def test_a_langchain_tool_sends_a_form_and_keys_it_by_the_tool_call_id(
    payments: Payments, client: IrrevClient
) -> None:
    customer, call_id = fresh("cus"), fresh("call")
    tool = http_tool(
        client,
        name="charge_customer",
        description="Charge a customer's card.",
        tool="payments",
        method="POST",
        path="/v1/charges",
        args_schema=Charge,
        body="form",
    )
    call = {"name": "charge_customer", "args": charge(customer), "id": call_id, "type": "tool_call"}
    first, again = [await tool.ainvoke(call) for _ in range(2)]
    assert first.artifact.ok and not first.artifact.replayed, first.artifact
    assert again.artifact.replayed and again.content == first.content
    assert len(await payments.made(customer=customer)) == 1


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("thread-1", "pay", 3), ("thread-1", "pay", 4)),
        (("thread-1", "pay", 3), ("thread-1", "pay", "3")),
        (("a|b", "c", 1), ("a", "b|c", 1)),
        (("t", "pay", 3), ("t", "pay", 3, 1)),
    ],
    ids=["step", "int-vs-str", "separator", "attempt"],
)
def test_step_keys_differ_when_any_part_does(
    one: tuple[str | int, ...], other: tuple[str | int, ...]
) -> None:
    assert step_key(*one) == step_key(*one)
    assert step_key(*one) != step_key(*other)


def test_a_step_key_is_an_idempotency_key_whatever_its_parts() -> None:
    key = step_key("thread \u00e9\u00e8 \n" * 100, "pay", 2**62)
    assert len(key) <= 255 and set(key) <= set(string.ascii_lowercase + string.digits + "-")
    # Parts a caller typed loosely (Any) may send: refused when it runs.
    loose: list[tuple[Any, ...]] = [(), (True,), (1.5,), (None,)]
    for parts in loose:
        with pytest.raises(ValueError):
            step_key(*parts)


# Each adapter, with the package its extra brings made unimportable.
ADAPTERS = [
    ("irrev.langchain", "langchain_core", "langchain"),
    ("irrev.langgraph", "langgraph", "langgraph"),
    ("irrev.openai_agents", "agents", "openai-agents"),
]


@pytest.mark.parametrize(("module", "package", "extra"), ADAPTERS, ids=[a[2] for a in ADAPTERS])
def test_an_adapter_without_its_extra_names_the_extra_to_install(
    module: str, package: str, extra: str
) -> None:
    # A finder ahead of all others refuses the package: as if it were not installed.
    script = f"""
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {package!r} or name.startswith({package!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
try:
    import {module}
except ImportError as exc:
    print(type(exc).__name__, exc)
"""
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert shown.startswith("ImportError "), shown
    assert f"pip install 'irrev[{extra}]'" in shown and package in shown, shown
