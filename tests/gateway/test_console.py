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
Screenshots of each step are saved under $IRREV_ARTIFACTS (or the test's tmp dir)
and their folder printed.

Every wait is on a condition of the page, with a deadline generous enough for a
loaded 2-core machine; nothing waits a fixed time.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from pricing.money import money_text

from .conftest import Gateway
from .helpers import assert_problem, effect_headers, order
from .servers import Tenant

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
USD = 1_000_000
WAIT_S = 120.0  # a deadline, not a delay: every wait ends as soon as the page is there
REASON = "budget owner agreed: quarterly restock"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        why = f"no {', '.join(missing)}: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}", pytrace=False)
        pytest.skip(why)
    root = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where chromium's sandbox will not start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-proxy-server",  # the gateway is on loopback; a proxy variable must not apply
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--window-size=1440,1000",
        f"--user-data-dir={root / 'profile'}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Both binaries by path: Selenium Manager is never asked to find (or download) one.
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(root / "driver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    base = os.environ.get("IRREV_ARTIFACTS")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)
    folder = Path(base) / name if base else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {folder}")
    return folder


class Page:
    """The console in the browser: waits on its DOM, and screenshots of it. A wait
    that times out fails with a screenshot, what the page showed and its console log."""

    def __init__(self, driver: WebDriver, folder: Path) -> None:
        self.driver = driver
        self.folder = folder
        self.shots = 0

    def sign_in(self, gateway: Gateway, tenant: Tenant) -> str:
        """Signs in with the operator's token and picks `tenant`, refreshed every 2 s;
        returns the selector of the tenant account's row."""
        self.driver.get(f"{gateway.url}/console")
        # A sign-in of an earlier test (the tab keeps it) is undone: this one types its own.
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.refresh()
        self.find("#token").send_keys(gateway.admin_token)
        self.find("#signin").click()
        self.until(
            ec.presence_of_element_located(
                (By.CSS_SELECTOR, f'#tenant option[value="{tenant.id}"]')
            ),
            f"the tenant list has no {tenant.id}",
        )
        Select(self.find("#tenant")).select_by_value(tenant.id)
        Select(self.find("#interval")).select_by_value("2")
        return f'tr[data-account="tenant:{tenant.id}"]'

    def decided(self, *words: str) -> None:
        """Waits until one row of the recent decisions has every one of `words`."""
        self.until(
            lambda driver: any(
                all(word in tr.text for word in words)
                for tr in driver.find_elements(By.CSS_SELECTOR, "#decisions tbody tr")
            ),
            f"no recent decision with {words}",
        )

    def until(self, condition: Callable[[WebDriver], Any], what: str | Callable[[], str]) -> Any:
        try:
            return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.2).until(condition)
        except TimeoutException:
            shot = self.shot("timed-out")
            shown = self.driver.execute_script(
                "return [document.getElementById('error').textContent,"
                " document.getElementById('login-error').textContent,"
                " document.getElementById('updated').textContent]"
            )
            log = [entry["message"] for entry in self.driver.get_log("browser")]
            said = what() if callable(what) else what
            raise AssertionError(
                f"{said}; the page showed (error, sign-in error, updated) {shown}, see {shot}; "
                f"its console: {log}"
            ) from None

    def find(self, css: str) -> WebElement:
        found: WebElement = self.until(
            ec.visibility_of_element_located((By.CSS_SELECTOR, css)), f"no {css}"
        )
        return found

    def text_is(self, css: str, text: str) -> None:
        """Waits until the element at `css` shows exactly `text`."""
        last = ["(no such element)"]

        def shows(driver: WebDriver) -> bool:
            try:
                last[0] = driver.find_element(By.CSS_SELECTOR, css).text
            except (NoSuchElementException, StaleElementReferenceException):
                return False
            return last[0] == text

        self.until(shows, lambda: f"{css} never showed {text!r}, last {last[0]!r}")

    def gone(self, element: WebElement, what: str) -> None:
        self.until(ec.staleness_of(element), what)

    def shot(self, name: str) -> Path:
        self.shots += 1
        path = self.folder / f"{self.shots:02d}-{name}.png"
        # The whole page, not just the window: the sections run below the fold.
        capture = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )
        path.write_bytes(base64.b64decode(capture["data"]))
        return path


def csp_complaints(driver: WebDriver) -> list[str]:
    """What the page's console said of a blocked script, style or request, or of an
    uncaught error."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Uncaught" in entry["message"]
    ]


def test_an_operator_approves_an_escalation_in_the_console_and_sees_the_balance_move(
    gateway: Gateway, browser: WebDriver, artifacts: Path
) -> None:
    tenant = gateway.tenant("console")
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

        def body_shown(driver: WebDriver) -> bool:
            try:
                pre = driver.find_element(By.CSS_SELECTOR, f"{row_css} td.request pre")
                return "s-console" in (pre.get_attribute("textContent") or "")
            except (NoSuchElementException, StaleElementReferenceException):
                return False

        page.until(body_shown, "the request body was never read from the hold")

        row.find_element(By.CSS_SELECTOR, "input.reason").send_keys(REASON)
        row.find_element(By.CSS_SELECTOR, "button.approve").click()
        page.gone(row, f"{escalation} is still in the queue")
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
    gateway: Gateway, browser: WebDriver, artifacts: Path
) -> None:
    tenant = gateway.tenant("console-resolve")
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
