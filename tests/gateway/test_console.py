"""The operator console (issue 14) in a real browser: Debian's chromium, headless,
driven by Selenium through Debian's chromedriver, against a real `irrev serve` with
two workers on a real Redis and the real supplier upstream.

An operator signs in with an admin token, an agent's order escalates and appears in
the page by itself (auto-refresh) with its context (who, route, amounts with their
currency, age and time left, what tripped), the accounts sorted by how close each
is to its limit, the operator approves it with a
reason through the page, the tenant's balance moves from pending to posted, and the
approval with its reason shows among the recent decisions (the events feed). An
ambiguous hold is reconciled, then voided by hand with a reason, through the page.
At 800 x 900 (issue 26), the refusals the agents got are seen by reason, agent and
route; escalations filtered to one agent are approved in one action with one reason,
one of them decided by someone else meanwhile reported as such; a row's Reject is on
screen; rules are set and ended from the page, and an approver's raise is refused
with the gateway's words; every control is on screen, at 800 px and wide.
Screenshots of each step are saved under $IRREV_ARTIFACTS (or the test's tmp dir)
and their folder printed.

Every wait is on a condition of the page, with a deadline generous enough for a
loaded 2-core machine; nothing waits a fixed time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select

from irrev.harness import new_token
from pricing.credentials import hash_token
from pricing.money import money_text

from .conftest import Gateway, TenantMaker
from .console_page import WAIT_S, Page, csp_complaints
from .helpers import assert_problem, effect_headers, mcp_call, order
from .procurement import flooded_orders
from .servers import Tenant
from .test_stress import SLOW, stressed_routes

# Slow (README's test command leaves it out; .ci/run runs it).
# What a browser shows and does is the same on every server: the console's reads and
# decisions run on the cluster in the approvals and operations suites.
pytestmark = [pytest.mark.slow, pytest.mark.server_neutral]


@pytest.fixture(scope="module")
def console_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("console")


@pytest.fixture(scope="module")
def console_resolve_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("console-resolve")


# A tenant admin of `console-ops` who may approve but not raise a limit.
CONSOLE_APPROVER = new_token()

# A tenant admin of `console-keys` who may manage viewer and approver keys, not agents'.
CONSOLE_KEYS_APPROVER = new_token()


@pytest.fixture(scope="module")
def console_ops_tenant(new_tenant: TenantMaker) -> Tenant:
    """The console's refusals view, bulk decisions and rules: every supplier order
    above 50 USD waits for a human."""
    admins = {"ann": {"token_sha256": hash_token(CONSOLE_APPROVER), "role": "approver"}}
    return new_tenant("console-ops", **flooded_orders(), admins=admins)


@pytest.fixture(scope="module")
def console_stress_tenant(new_tenant: TenantMaker) -> Tenant:
    """The console's stress detectors: one on the supplier's orders, tripped by the
    4th order of a burst (tests/gateway/test_stress.py)."""
    return new_tenant("console-stress", routes=stressed_routes(SLOW))


@pytest.fixture(scope="module")
def console_keys_tenant(new_tenant: TenantMaker) -> Tenant:
    """The console's Keys panel."""
    admins = {"kim": {"token_sha256": hash_token(CONSOLE_KEYS_APPROVER), "role": "approver"}}
    return new_tenant("console-keys", admins=admins)


USD = 1_000_000
REASON = "budget owner agreed: quarterly restock"


def test_an_operator_approves_an_escalation_in_the_console_and_sees_the_balance_move(
    console_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    tenant = console_tenant
    page = Page(browser, artifacts)
    account = page.sign_in(gateway, tenant)
    page.text_is(f"{account} td.pending", "0 USD")
    page.text_is(f"{account} td.posted", "0 USD")
    page.shot("signed-in")

    # An agent's order above the route's approval threshold (30,000 USD face value)
    # waits for a human; nobody touches the page, its auto-refresh brings it in.
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        escalated = http.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id="s-console"),
            headers=effect_headers(tenant, "buyer-03", "console-approve-1"),
        )
        assert escalated.status_code == 202, escalated.text
        escalation = escalated.json()["escalation"]
        price = money_text(int(escalated.headers["x-irrev-price"]), USD, "USD")

        row_css = f'tr[data-escalation="{escalation}"]'
        row = page.find(row_css)
        page.text_is(f"{row_css} td.price", price)
        page.text_is(f"{row_css} td.face", "45,000 USD")  # 450 x 100 USD
        assert row.find_element(By.CSS_SELECTOR, "td.who").text.split() == [
            "buyer-03",
            "procurement",
        ]
        assert "POST /orders" in row.find_element(By.CSS_SELECTOR, "td.route").text
        # Beside the route's template, the request line a forward sends: the approver
        # approves this path and query, not the template.
        target = row.find_element(By.CSS_SELECTOR, "td.route div.target").text
        assert target == "POST /orders", target
        page.text_is(f"{account} td.pending", price)  # reserved while it waits
        # How long it has waited and has left (the example's escalation_ttl is 30m),
        # and what tripped: the route's approval threshold.
        when = row.find_element(By.CSS_SELECTOR, "td.when").text
        assert re.search(r"\d+s ago", when) and re.search(r"(29m \d+s|30m 0s) left", when), when
        tripped = row.find_element(By.CSS_SELECTOR, "td.tripped").text
        assert "threshold" in tripped, tripped
        # Utilisation: accounts closest to their limit first.
        shown = [
            (tr.get_attribute("data-account"), tr.find_element(By.CSS_SELECTOR, "span.pct").text)
            for tr in browser.find_elements(By.CSS_SELECTOR, "#balances tbody tr")
        ]
        ratios = [float(pct.rstrip("%")) for _, pct in shown]
        assert len(shown) >= 3 and ratios == sorted(ratios, reverse=True) and ratios[0] > 0, shown
        assert f"tenant:{tenant.id}" in dict(shown)
        page.shot("escalation-waiting")
        # The queue's page has no bodies: opening one reads it from the hold.
        page.find(f"{row_css} td.request summary").click()

        def body_shown(driver: Chrome) -> bool:
            try:
                pre = driver.find_element(By.CSS_SELECTOR, f"{row_css} td.request pre")
                return "s-console" in (pre.get_attribute("textContent") or "")
            except (NoSuchElementException, StaleElementReferenceException):
                return False

        page.until(body_shown, "the request body was never read from the hold")

        row.find_element(By.CSS_SELECTOR, "input.reason").send_keys(REASON)
        row.find_element(By.CSS_SELECTOR, "button.approve").click()
        page.left_in_place(row_css, "approved by operator:")
        page.text_is(f"{account} td.posted", price)
        page.text_is(f"{account} td.pending", "0 USD")
        flash = page.find("#flash").text
        assert escalation in flash and "approved" in flash and REASON in flash, flash
        page.decided("approved", REASON, "buyer-03")
        page.shot("approved")

        # The gateway agrees: the approval forwarded the order once and the agent's
        # poll gets the supplier's answer.
        polled = http.get(escalated.headers["location"], headers=tenant.auth("buyer-03"))
        assert polled.status_code == 201, polled.text
        hold = escalated.headers["x-irrev-hold"]
        held = http.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold}", headers=gateway.admin)
        assert held.status_code == 200, held.text
        assert (held.json()["state"], held.json()["note"]) == ("posted", REASON)

    assert not csp_complaints(browser)


def test_an_operator_reconciles_then_voids_an_ambiguous_hold_with_a_reason_in_the_console(
    console_resolve_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    tenant = console_resolve_tenant
    page = Page(browser, artifacts)
    account = page.sign_in(gateway, tenant)
    page.text_is(f"{account} td.pending", "0 USD")

    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        # The supplier fails the order without making it: 503, so the gateway cannot
        # know, and the hold stays charged as ambiguous.
        faults = {"status": 503, "apply": False, "times": 1}
        assert http.post(f"{tenant.supplier}/_faults", json=faults).status_code == 200
        failed = http.post(
            "/tools/supplier/orders",
            json=order(quantity=30),
            headers=effect_headers(tenant, "buyer-05", "console-ambiguous-1"),
        )
        assert_problem(failed, 502, "upstream_ambiguous")
        hold = failed.headers["x-irrev-hold"]
        price = money_text(int(failed.headers["x-irrev-price"]), USD, "USD")

        row_css = f'tr[data-hold="{hold}"]'
        row = page.find(row_css)
        assert "buyer-05" in row.text and price in row.text, row.text
        page.text_is(f"{account} td.pending", price)

        # Reconciling asks the supplier, which has no such order; before the hold's
        # deadline that proves nothing, so it is left for a human, and says why.
        page.find("#reconcile").click()
        page.until(
            lambda driver: (
                "1 left for a human" in driver.find_element(By.ID, "reconcile-report").text
            ),
            "no reconciliation report",
        )
        page.shot("ambiguous-after-reconcile")

        # Resolving by hand wants a reason first.
        row.find_element(By.CSS_SELECTOR, "button.voided").click()
        page.until(ec.visibility_of_element_located((By.ID, "error")), "no demand for a reason")
        why = "supplier support confirmed no order was created"
        row.find_element(By.CSS_SELECTOR, "input.reason").send_keys(why)
        row.find_element(By.CSS_SELECTOR, "button.voided").click()
        page.gone(row, f"{hold} is still listed as ambiguous")
        page.text_is(f"{account} td.pending", "0 USD")
        page.text_is(f"{account} td.posted", "0 USD")
        page.decided("resolved", "voided", why, "buyer-05")
        page.shot("resolved")

        held = http.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold}", headers=gateway.admin)
        assert held.status_code == 200, held.text
        assert (held.json()["state"], held.json()["resolution_note"]) == ("voided", why)

    assert not csp_complaints(browser)


# Every control the page shows (buttons, inputs, selects, a body's summary) must be on
# screen once scrolled to, inside the window's width, and not covered by anything; and
# the page must never scroll sideways.
UNREACHABLE = """
const width = document.documentElement.clientWidth;
const out = [];
if (document.documentElement.scrollWidth > width) {
  out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${width} px window`);
}
const controls = document.querySelectorAll(
  "header button, header select, #app button, #app input, #app select, #app summary");
for (const e of controls) {
  if (!e.getClientRects().length) continue;  // not shown (hidden, an empty section)
  e.scrollIntoView({ block: "center", inline: "nearest" });
  const r = e.getBoundingClientRect();
  const name = `${e.tagName.toLowerCase()}#${e.id}.${e.className} "${(e.textContent || e.placeholder || "").trim().slice(0, 30)}"`;
  // Where it is on the page, had the window not scrolled sideways to show it.
  const [left, right] = [r.left + scrollX, r.right + scrollX];
  if (left < 0 || right > width + 0.5 || r.top < 0 || r.bottom > innerHeight + 0.5) {
    out.push(`${name} is off-screen at ${Math.round(left)}..${Math.round(right)} of ${width}`);
    continue;
  }
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
  if (hit !== e && !e.contains(hit)) out.push(`${name} is covered by ${hit && hit.tagName}`);
}
window.scrollTo(0, 0);
return out;
"""


def assert_every_control_visible(driver: Chrome, when: str) -> None:
    hidden: list[str] = driver.execute_script(UNREACHABLE)
    assert not hidden, f"{when}: {hidden}"


def attribute(element: WebElement, name: str) -> str:
    value = element.get_attribute(name)
    assert value is not None, f"no {name} on {element.tag_name}"
    return value


def refusal_row(driver: Chrome, reason: str, agent: str, via: str) -> str:
    """The count the refusals table shows for (reason, agent, transport), or ''."""
    css = f'#refusals tr[data-reason="{reason}"][data-agent="{agent}"][data-via="{via}"] td.n'
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return str(found[0].text) if found else ""


def refusal_counted(reason: str, agent: str, via: str, count: str) -> Callable[[Chrome], bool]:
    """The refusals table shows `count` for (reason, agent, transport)."""
    return lambda driver: refusal_row(driver, reason, agent, via) == count


def left_the_queue(escalation: str) -> Callable[[Chrome], bool]:
    css = f'tr[data-escalation="{escalation}"]'
    return lambda driver: not driver.find_elements(By.CSS_SELECTOR, css)


def test_at_800_px_an_operator_sees_refusals_decides_in_bulk_and_sets_rules(
    console_ops_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    """Issue 26's hostile round, in the page at 800 x 900: the refusals the agents got
    (HTTP and MCP, before the ledger) are seen by reason, agent and route; a filtered
    set of escalations is approved with one reason in one action, each by its own
    consume-once call, one already rejected meanwhile reported as such; a row's Reject
    is on screen; rules are set and ended from the page, and a role that may not raise
    a limit is told why by the gateway. Every control is on screen throughout."""

    tenant = console_ops_tenant
    page = Page(browser, artifacts)
    browser.set_window_size(800, 900)
    escalations: dict[str, list[str]] = {"buyer-05": [], "buyer-06": []}
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
            # Refusals: before the ledger, a cap (3) and unlisted routes (2), and over MCP.
            for n in range(3):
                capped = http.post(
                    "/tools/supplier/orders",
                    json=order(quantity=600),
                    headers=effect_headers(tenant, "buyer-01", f"cap-{n}"),
                )
                assert_problem(capped, 403, "per_effect_cap")
            for n in range(2):
                unlisted = http.post(
                    f"/tools/supplier/nowhere/{n}",
                    json=order(),
                    headers=effect_headers(tenant, "buyer-02", f"nowhere-{n}"),
                )
                assert_problem(unlisted, 403, "unknown_route")
            body, headers = mcp_call(tenant, "buyer-03", "nowhere__tool")
            assert http.post("/mcp", content=body, headers=headers).json()["result"]["isError"]
            # Near-identical escalations (every order above 50 USD waits) of two agents.
            for agent, count in (("buyer-05", 4), ("buyer-06", 2)):
                for n in range(count):
                    waiting = http.post(
                        "/tools/supplier/orders",
                        json=order(quantity=1, supplier_id=f"s-{agent}-{n}"),
                        headers=effect_headers(tenant, agent, f"bulk-{agent}-{n}"),
                    )
                    assert waiting.status_code == 202, waiting.text
                    escalations[agent].append(waiting.json()["escalation"])

            page.sign_in(gateway, tenant)
            assert browser.execute_script("return innerWidth") <= 800

            # The refusals, counted by the fleet, by reason, agent and route.
            for reason, agent, via, shown_n in (
                ("per_effect_cap", "buyer-01", "http", "3"),
                ("unknown_route", "buyer-02", "http", "2"),
                ("unknown_route", "buyer-03", "mcp", "1"),
            ):
                page.until(
                    refusal_counted(reason, agent, via, shown_n),
                    f"no refusal row {reason} {agent} {via} x{shown_n}",
                )
            page.text_is("#refusal-count", "6")
            routes = page.find("#refusal-routes").text
            assert "supplier POST /orders" in routes and "supplier POST (unlisted)" in routes
            Select(page.find("#refusal-reason")).select_by_value("per_effect_cap")
            shown = browser.find_elements(By.CSS_SELECTOR, "#refusals tbody tr")
            assert [attribute(tr, "data-reason") for tr in shown] == ["per_effect_cap"]
            page.shot("refusals-800")

            # The queue, filtered to one agent, all shown selected, approved at once.
            for escalation in (*escalations["buyer-05"], *escalations["buyer-06"]):
                page.find(f'tr[data-escalation="{escalation}"]')
            assert_every_control_visible(browser, "the queue at 800 px")
            Select(page.find("#interval")).select_by_value("0")  # the page holds still
            Select(page.find("#filter-agent")).select_by_value("buyer-05")
            rows = browser.find_elements(By.CSS_SELECTOR, "#escalations tbody tr")
            assert sorted(attribute(tr, "data-escalation") for tr in rows) == sorted(
                escalations["buyer-05"]
            )
            page.find("#select-shown").click()
            page.text_is("#bulk-count", "4 selected")
            # Someone else rejects one of them meanwhile: its approval must lose.
            late = escalations["buyer-05"][0]
            beaten = http.post(
                f"/v1/escalations/{late}/reject",
                json={"reason": "dup"},
                headers=gateway.admin,
            )
            assert beaten.status_code == 200, beaten.text
            why = "restock approved in bulk"
            page.find("#bulk-reason").send_keys(why)
            page.find("#bulk-approve").click()
            page.until(
                lambda driver: len(driver.find_elements(By.CSS_SELECTOR, "#bulk-report li")) == 4,
                "no outcome for each escalation",
            )
            report = {
                li.find_element(By.CSS_SELECTOR, "span").text: li.get_attribute("class")
                for li in browser.find_elements(By.CSS_SELECTOR, "#bulk-report li")
            }
            assert report == {e: "done" for e in escalations["buyer-05"][1:]} | {late: "resolved"}
            resolved = browser.find_element(By.CSS_SELECTOR, "#bulk-report li.resolved").text
            assert "already rejected by operator:ops" in resolved, resolved
            flash = page.find("#flash").text
            assert "3 approved, 1 already decided" in flash and why in flash, flash
            for escalation in escalations["buyer-05"][1:]:
                page.until(left_the_queue(escalation), f"{escalation} is still in the queue")
            page.shot("bulk-approved-800")
            # Each approval forwarded its order once; the agent reads the one reason.
            for escalation in escalations["buyer-05"][1:]:
                polled = http.get(f"/v1/escalations/{escalation}", headers=tenant.auth("buyer-05"))
                assert polled.status_code == 201, polled.text
                assert unquote(polled.headers["x-irrev-note"]) == why

            # One agent's escalation rejected by its row's own button, on screen at 800 px.
            Select(page.find("#interval")).select_by_value("2")
            Select(page.find("#filter-agent")).select_by_value("buyer-06")
            target = escalations["buyer-06"][0]
            row = page.find(f'tr[data-escalation="{target}"]')
            row.find_element(By.CSS_SELECTOR, "input.reason").send_keys("not this supplier")
            reject = row.find_element(By.CSS_SELECTOR, "button.reject")
            assert reject.is_displayed()
            reject.click()
            page.left_in_place(f'tr[data-escalation="{target}"]', "rejected by operator:")
            polled = http.get(f"/v1/escalations/{target}", headers=tenant.auth("buyer-06"))
            assert_problem(polled, 403, "escalation_rejected")

            # Rules from the page: an auto-approval and a raise, listed; the first ended.
            rules = f"/v1/admin/tenants/{tenant.id}/rules"
            page.find("#rule-who").send_keys("buyer-06")
            page.find("#rule-max-price").send_keys("100")
            page.find("#rule-duration").clear()
            page.find("#rule-duration").send_keys("1h")
            page.find("#rule-reason").send_keys("trusted restock")
            page.find("#rule-set").click()
            page.until(
                lambda driver: "agent buyer-06" in driver.find_element(By.ID, "rules").text,
                "the auto-approval is not listed",
            )
            Select(page.find("#rule-kind")).select_by_value("raise_limit")
            page.find("#rule-account").send_keys("principal:procurement")
            page.find("#rule-amount").send_keys("1000")
            page.find("#rule-reason").send_keys("quarter-end")
            page.find("#rule-set").click()
            page.until(
                lambda driver: "principal:procurement" in driver.find_element(By.ID, "rules").text,
                "the raise is not listed",
            )
            page.until(
                lambda driver: (
                    "raised by 1,000 USD"
                    in driver.find_element(
                        By.CSS_SELECTOR, 'tr[data-account="principal:procurement"]'
                    ).text
                ),
                "the utilisation does not show the raise",
            )
            assert_every_control_visible(browser, "rules and queue at 800 px")
            page.shot("rules-800")
            live = http.get(rules, headers=gateway.admin).json()["rules"]
            auto = next(r for r in live if r["kind"] == "auto_approve")
            assert (auto["agent"], auto["max_price"], auto["by"]) == (
                "buyer-06",
                100 * USD,
                "operator:ops",
            )
            ended = page.find(f'#rules tr[data-rule="{auto["rule"]}"] button.end')
            ended.click()
            page.gone(ended, f"rule {auto['rule']} is still listed")
            live = http.get(rules, headers=gateway.admin).json()["rules"]
            assert [r["kind"] for r in live] == ["raise_limit"]

            # An approver may not raise a limit: the page says what the gateway said.
            page.sign_in(gateway, tenant, CONSOLE_APPROVER)
            Select(page.find("#rule-kind")).select_by_value("raise_limit")
            page.find("#rule-account").send_keys("principal:procurement")
            page.find("#rule-amount").send_keys("500")
            page.find("#rule-reason").send_keys("more please")
            page.find("#rule-set").click()
            page.until(
                lambda driver: (
                    "needs the policy_admin role" in driver.find_element(By.ID, "rule-error").text
                ),
                "the role's refusal is not shown",
            )
            assert "'ann' is approver" in page.find("#rule-error").text
            page.shot("refused-role-800")
            assert len(http.get(rules, headers=gateway.admin).json()["rules"]) == 1

        # And wide, the same page keeps every control on screen.
        browser.set_window_size(1440, 1000)
        page.find("#rule-set")
        assert_every_control_visible(browser, "at 1440 px")
        page.shot("wide")
    finally:
        browser.set_window_size(1440, 1000)
    assert not csp_complaints(browser)


def test_an_admin_sees_a_tenants_keys_and_revokes_one_in_the_console(
    console_keys_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    """The Keys panel lists a tenant's managed keys (whose, owner and purpose, expiry,
    last use, state), never a token; its Revoke is the API's, role-checked there: an
    approver's revocation of an agent key is refused in the gateway's words, its
    revocation of a viewer key is done, an operator's of the agent key too, and the
    revoked token is then refused by the gateway."""

    tenant = console_keys_tenant
    page = Page(browser, artifacts)
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        keys = f"/v1/admin/tenants/{tenant.id}/keys"
        made = http.post(
            keys,
            json={
                "kind": "agent",
                "agent": "buyer-05",
                "owner": "ops@example.com",
                "purpose": "nightly",
            },
            headers=gateway.admin,
        )
        assert made.status_code == 201, made.text
        agent_key = made.json()
        made = http.post(
            keys,
            json={"kind": "admin", "admin": "vik", "role": "viewer", "owner": "vik@example.com"},
            headers=gateway.admin,
        )
        assert made.status_code == 201, made.text
        viewer_key = made.json()
        agent_row = f'#keys tr[data-key="{agent_key["key_id"]}"]'
        viewer_row = f'#keys tr[data-key="{viewer_key["key_id"]}"]'

        page.sign_in(gateway, tenant, CONSOLE_KEYS_APPROVER)
        page.text_is(f"{agent_row} td.key-state", "live")
        shown = page.find(agent_row).text
        assert "agent buyer-05" in shown and "ops@example.com" in shown and "nightly" in shown
        assert "admin vik (viewer)" in page.find(viewer_row).text
        page.find(f"{agent_row} button.end").click()
        page.until(
            lambda driver: (
                "needs the policy_admin role" in driver.find_element(By.ID, "error").text
            ),
            "the role's refusal is not shown",
        )
        page.text_is(f"{agent_row} td.key-state", "live")
        page.find(f"{viewer_row} button.end").click()
        page.text_is(f"{viewer_row} td.key-state", "revoked")
        page.shot("keys-approver")

        page.sign_in(gateway, tenant)
        page.find(f"{agent_row} button.end").click()
        page.text_is(f"{agent_row} td.key-state", "revoked")
        page.shot("keys-revoked")
        for key in (agent_key, viewer_key):
            assert key["token"] not in browser.page_source
        deadline = time.monotonic() + WAIT_S
        token = {"Authorization": f"Bearer {agent_key['token']}"}
        while http.get("/tools/supplier/catalog", headers=token).status_code != 401:
            assert time.monotonic() < deadline, "the revoked key is still admitted"
            time.sleep(0.1)
    assert not csp_complaints(browser)


def test_an_operator_sees_a_routes_stress_detector_trip_in_the_console(
    console_stress_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    """A burst of orders trips the route's detector, which the page shows on, with
    until when the route is priced at its face value and when it tripped."""
    tenant = console_stress_tenant
    page = Page(browser, artifacts)
    state = '#stress tr[data-route="supplier POST /orders"] td.stress-state'

    def shown(driver: Chrome) -> str:
        return str(driver.find_element(By.CSS_SELECTOR, state).text)

    page.sign_in(gateway, tenant)
    page.until(lambda driver: shown(driver).startswith("off"), "the detector is not shown off")
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        for i in range(4):
            headers = effect_headers(tenant, "buyer-01", f"stress-{i}")
            bought = http.post("/tools/supplier/orders", json=order(quantity=1), headers=headers)
            assert bought.status_code == 201, bought.text
    page.until(lambda driver: shown(driver).startswith("on"), "the detector's trip is not shown")
    assert "priced at 1 of face value until" in shown(browser)
    assert page.find('#stress tr[data-route="supplier POST /orders"] td.last').text != "never"
    assert page.find("#stress-count").text == "1 on"
    page.shot("stress-on")
    assert not csp_complaints(browser)


async def test_the_console_is_served_whole_by_the_gateway_under_a_strict_policy(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    page = await http.get("/console")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    # No inline script or style for the policy to have to allow, and nothing fetched
    # from anywhere but this gateway.
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)
    assert "<style" not in page.text and " style=" not in page.text
    assert "http://" not in page.text and "https://" not in page.text
    linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(linked) == ["/console/console.css", "/console/console.js", "/console/icon.svg"]
    types = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
    for path in linked:
        asset = await http.get(path)
        assert asset.status_code == 200, path
        assert asset.headers["content-type"].startswith(types[path.rsplit(".", 1)[1]])
        assert asset.headers["x-content-type-options"] == "nosniff"
        text = re.sub(r'xmlns="[^"]*"', "", asset.text)  # a name, never fetched
        assert "http://" not in text and "https://" not in text, path
