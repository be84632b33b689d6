"""The operator console in a real browser, for its tests (test_console.py,
test_console_agents.py, test_console_pointer.py): Debian's chromium, headless,
driven by Selenium through Debian's chromedriver. Every wait is on a condition of the page, with a deadline
generous enough for a loaded 2-core machine; nothing waits a fixed time."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver import ActionChains, Chrome
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from .conftest import Gateway
from .servers import Tenant

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 120.0  # a deadline, not a delay: every wait ends as soon as the page is there


def start_browser(root: Path) -> Chrome:
    """A headless chromium with its profile and its driver's log under `root`; skipped
    (failed on CI) where Debian's chromium or chromedriver is not installed."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        why = f"no {', '.join(missing)}: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}", pytrace=False)
        pytest.skip(why)
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
    return driver


def artifacts_folder(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test's screenshots go: $IRREV_ARTIFACTS/<test>, or its tmp dir."""
    base = os.environ.get("IRREV_ARTIFACTS")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)
    folder = Path(base) / name if base else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {folder}")
    return folder


class Page:
    """The console in the browser: waits on its DOM, and screenshots of it. A wait
    that times out fails with a screenshot, what the page showed and its console log."""

    def __init__(self, driver: Chrome, folder: Path) -> None:
        self.driver = driver
        self.folder = folder
        self.shots = 0

    def sign_in(self, gateway: Gateway, tenant: Tenant, token: str | None = None) -> str:
        """Signs in with `token` (the operator's by default) and picks `tenant`,
        refreshed every 2 s; returns the selector of the tenant account's row."""
        self.driver.get(f"{gateway.url}/console")
        # A sign-in of an earlier test (the tab keeps it) is undone: this one types its own.
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.refresh()
        self.find("#token").send_keys(token or gateway.admin_token)
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

    def left_in_place(self, row_css: str, how: str) -> None:
        """Waits until the queue's row at `row_css` says its escalation left it `how`
        ("approved by"), greyed in its place: while the pointer rests on the queue its
        rows hold still (console.js holdStill); then moves the pointer off the queue,
        and waits until the row is gone."""
        row = self.find(row_css)
        last = [""]

        def says(driver: Chrome) -> bool:
            notes = driver.find_elements(By.CSS_SELECTOR, f"{row_css}.gone .gone-note")
            last[0] = notes[0].text if notes else ""
            return how in last[0]

        self.until(says, lambda: f"{row_css} never said {how!r} in place, last {last[0]!r}")
        ActionChains(self.driver).move_to_element(self.find("header h1")).perform()
        self.gone(row, f"{row_css} is still in the queue once the pointer left it")

    def until(self, condition: Callable[[Chrome], Any], what: str | Callable[[], str]) -> Any:
        """`condition` met within WAIT_S. The page re-renders its panels as it refreshes,
        so an element found may be replaced before it is read: that poll is retried
        (a stale element), as one that is not there yet is."""
        wait = WebDriverWait(
            self.driver,
            WAIT_S,
            poll_frequency=0.2,
            ignored_exceptions=(StaleElementReferenceException,),
        )
        try:
            return wait.until(condition)
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

        def shows(driver: Chrome) -> bool:
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
        # The whole page, not just the window: the sections run below the fold. Without
        # its scrollbar, which chromium's capture of the whole page would cut the page's
        # right edge for.
        hide = "document.documentElement.style.scrollbarWidth = arguments[0]"
        # Drawn without it before the capture (two frames), or it is not always gone.
        self.driver.execute_async_script(
            f"{hide}; const done = arguments[arguments.length - 1];"
            " requestAnimationFrame(() => requestAnimationFrame(done));",
            "none",
        )
        try:
            capture = self.driver.execute_cdp_cmd(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
            )
        finally:
            self.driver.execute_script(hide, "")
        path.write_bytes(base64.b64decode(capture["data"]))
        return path


def csp_complaints(driver: Chrome) -> list[str]:
    """What the page's console said of a blocked script, style or request, or of an
    uncaught error."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Uncaught" in entry["message"]
    ]
