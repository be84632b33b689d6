"""The approver's pointer approves the escalation it was put on (the security review of
the console's queue). The queue redraws itself on its auto-refresh, sorted by time
left, and dropped a row whose escalation left the queue: the rows below moved up. An
agent may void its own escalated decision-API hold (`POST /v1/holds/{id}/void`), so a
hostile agent could time a void of one of its escalations above the one the approver
points at and slide another of its escalations under the resting pointer, which the
approver's click then approved. Here the pointer is real input (Selenium's actions,
which chromium receives as mouse events): it rests on B's Approve, the agent voids A
above it, the page refreshes by itself, and the click lands where the pointer is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from selenium.webdriver import ActionChains, Chrome
from selenium.webdriver.common.by import By

from .conftest import Gateway, TenantMaker
from .helpers import DEPLOY, effect_headers
from .servers import EXAMPLES, Tenant

pytestmark = [pytest.mark.slow, pytest.mark.server_neutral]

AGENT = "deployer-01"
SETTLED_S = 120.0  # a deadline, not a delay


def _routes() -> list[dict[str, Any]]:
    """The example's routes, every deploy (1,000 USD) waiting for a person."""
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())[
        "routes"
    ]
    for route in routes:
        if route["route"] == "POST /deploys":
            route["approval_threshold"] = "1"
    return routes


@pytest.fixture(scope="module")
def pointer_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("console-pointer", routes=_routes())


def _escalate(http: httpx.Client, tenant: Tenant, key: str) -> dict[str, Any]:
    asked = http.post("/v1/holds", json=DEPLOY, headers=effect_headers(tenant, AGENT, key))
    assert asked.status_code == 202, asked.text
    view: dict[str, Any] = asked.json()
    return view


def _state(http: httpx.Client, gateway: Gateway, tenant: Tenant, hold: str) -> str:
    held = http.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold}", headers=gateway.admin)
    assert held.status_code == 200, held.text
    state: str = held.json()["state"]
    return state


def _rows(driver: Chrome) -> list[str | None]:
    """The queue's rows, top to bottom, by escalation id."""
    return [
        tr.get_attribute("data-escalation")
        for tr in driver.find_elements(By.CSS_SELECTOR, "#escalations tbody tr")
    ]


def _waiting(driver: Chrome) -> str:
    """The summary tile's count of escalations waiting, as the last refresh drew it."""
    value: str = driver.execute_script(
        "const tile = [...document.querySelectorAll('#summary .tile')]"
        ".find((t) => t.querySelector('.label').textContent === 'waiting for a human');"
        "return tile ? tile.querySelector('.value').textContent : '';"
    )
    return value


def test_a_row_that_leaves_the_queue_does_not_slide_another_under_the_approvers_pointer(
    pointer_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    from .console_page import Page

    tenant = pointer_tenant
    page = Page(browser, artifacts)
    page.sign_in(gateway, tenant)
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        # Oldest first: each has the same time to live, so A expires first, then B, C.
        a, b, c = (_escalate(http, tenant, f"pointer-{name}") for name in "abc")
        order = [e["escalation"] for e in (a, b, c)]
        page.until(lambda driver: _rows(driver) == order, "the queue never showed A, B, C")
        page.until(lambda driver: _waiting(driver) == "3", "the summary never counted 3 waiting")

        # The approver puts the pointer on B's Approve, and reads B.
        approve_b = page.find(
            f'#escalations tr[data-escalation="{b["escalation"]}"] button.approve'
        )
        ActionChains(browser).scroll_to_element(approve_b).perform()
        ActionChains(browser).move_to_element(approve_b).perform()
        page.shot("pointer-on-b")

        # Meanwhile the agent withdraws A, above B; the page refreshes by itself.
        voided = http.post(f"/v1/holds/{a['hold']}/void", headers=tenant.auth(AGENT))
        assert voided.status_code == 200, voided.text
        page.until(lambda driver: _waiting(driver) == "2", "the page never counted 2 waiting")
        page.shot("a-left")

        # The approver clicks where the pointer rests.
        ActionChains(browser).click().perform()
        deadline = time.monotonic() + SETTLED_S
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {n: _state(http, gateway, tenant, e["hold"]) for n, e in (("B", b), ("C", c))}
            if set(states.values()) != {"escalated"}:
                break
            time.sleep(0.2)
        page.shot("clicked")
        assert _state(http, gateway, tenant, a["hold"]) == "voided"
        assert states == {"B": "pending", "C": "escalated"}, (
            f"the click meant for B decided {states}: the row under the pointer changed"
        )
        # A stayed where it was, saying why it left; B says who approved it, and both
        # go once the pointer leaves the queue.
        row_a, row_b = (f'#escalations tr[data-escalation="{e["escalation"]}"]' for e in (a, b))
        page.text_is(f"{row_a} .gone-note", "no longer waiting: withdrawn by the agent")
        page.left_in_place(row_b, "approved by operator:")
        page.until(lambda driver: _rows(driver) == [c["escalation"]], "C is not alone in the queue")
        page.shot("sorted-again")
