"""The console's Agents list (docs/operations.md, "Stop an agent") in a real browser:
the refused agents are listed, most refused first, the others on request; an
approver's Suspend is refused in the gateway's words; an operator's Suspend asks for
a reason, then the page shows the agent suspended with who, when and why, and the
agent's next call is refused `agent_suspended` with that reason; Resume lets it
back. Every wait is on a condition of the page or of the gateway, with a deadline;
nothing waits a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from irrev.harness import new_token
from pricing.credentials import hash_token

from .conftest import Gateway, TenantMaker
from .console_page import WAIT_S, Page, csp_complaints
from .helpers import assert_problem, effect_headers, order
from .servers import Tenant

# Slow, as the other browser tests (.ci/run runs them).
pytestmark = [pytest.mark.slow, pytest.mark.server_neutral]

APPROVER = new_token()
SUSPENSION = "hammers unlisted routes: stopped while we look"
ROW = '#agents tr[data-agent="buyer-02"]'


@pytest.fixture(scope="module")
def console_agents_tenant(new_tenant: TenantMaker) -> Tenant:
    admins = {"abe": {"token_sha256": hash_token(APPROVER), "role": "approver"}}
    return new_tenant("console-agents", admins=admins)


def row_shows(state: str, *words: str) -> Callable[[Chrome], bool]:
    def shows(driver: Chrome) -> bool:
        row = driver.find_element(By.CSS_SELECTOR, ROW)
        text = row.find_element(By.CSS_SELECTOR, "td.agent-state").text
        return row.get_attribute("data-state") == state and all(w in text for w in words)

    return shows


def error_says(words: str) -> Callable[[Chrome], bool]:
    return lambda driver: words in driver.find_element(By.ID, "error").text


def next_call_until(
    http: httpx.Client, tenant: Tenant, done: Callable[[httpx.Response], bool]
) -> httpx.Response:
    """The agent's read, again until `done` (each gateway worker applies the change
    within its refresh); it changes nothing, however often it is sent."""
    deadline = time.monotonic() + WAIT_S
    while not done(answer := http.get("/tools/supplier/catalog", headers=tenant.auth("buyer-02"))):
        assert time.monotonic() < deadline, f"the agent's call still answered {answer.text}"
    return answer


def test_an_operator_suspends_an_agent_in_the_console_and_resumes_it(
    console_agents_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    tenant = console_agents_tenant
    page = Page(browser, artifacts)
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        for n in range(2):
            unlisted = http.post(
                f"/tools/supplier/nowhere/{n}",
                json=order(),
                headers=effect_headers(tenant, "buyer-02", f"nowhere-{n}"),
            )
            assert_problem(unlisted, 403, "unknown_route")

        page.sign_in(gateway, tenant, APPROVER)
        page.until(
            lambda driver: (
                driver.find_element(By.CSS_SELECTOR, "#agents tbody tr").get_attribute("data-agent")
                == "buyer-02"
            ),
            "the most refused agent is not listed first",
        )
        page.find(f"{ROW} input.reason").send_keys(SUSPENSION)
        page.find(f"{ROW} button.suspend").click()
        page.until(error_says("needs the policy_admin role"), "the role's refusal is not shown")
        page.until(row_shows("active"), "an approver's suspension was applied")
        page.shot("agents-approver")

        page.sign_in(gateway, tenant)
        quiet = '#agents tr[data-agent="buyer-01"]'
        assert not browser.find_elements(By.CSS_SELECTOR, quiet)  # never refused: not listed
        page.find("#all-agents").click()
        page.find(quiet)
        page.find(f"{ROW} button.suspend").click()
        page.until(error_says("Say why"), "a suspension without a reason was sent")
        page.find(f"{ROW} input.reason").send_keys(SUSPENSION)
        page.find(f"{ROW} button.suspend").click()
        page.until(
            row_shows("suspended", SUSPENSION, "operator:ops"),
            "the suspension is not shown with why and by whom",
        )
        page.find(f"{ROW} button.resume")  # offered, once suspended
        page.shot("agents-suspended")
        refused = next_call_until(http, tenant, lambda r: r.status_code == 403)
        assert SUSPENSION in assert_problem(refused, 403, "agent_suspended")["detail"]

        page.find(f"{ROW} button.resume").click()
        page.until(row_shows("active"), "the resumed agent is not shown active")
        page.find(f"{ROW} button.suspend")
        next_call_until(http, tenant, lambda r: r.status_code == 200)
        page.shot("agents-resumed")
    assert not csp_complaints(browser)
