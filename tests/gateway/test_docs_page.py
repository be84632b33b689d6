"""/docs on the console's origin is served like the console: a Content-Security-Policy
with frame-ancestors 'none', nosniff, no inline script, and only the files the page
loads (the stock Swagger UI files, such as an index.html that loads
petstore.swagger.io and oauth2-redirect.html, are not served). The page still
renders the API in a real browser under that policy."""

from __future__ import annotations

import re

import httpx
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .conftest import Gateway
from .console_page import WAIT_S
from .helpers import assert_problem

STOCK = (
    "index.html",
    "oauth2-redirect.html",
    "oauth2-redirect.js",
    "swagger-initializer.js",
    "index.css",
    "swagger-ui-bundle.js.map",
    "swagger-ui.js",
)


async def test_docs_and_their_assets_carry_the_console_policy(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """Before: no CSP or frame-ancestors on /docs or its assets, an inline script, and
    every file of the swagger-ui package served under /docs/assets/."""
    page = await http.get("/docs")
    assert page.status_code == 200
    csp = page.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, csp
    directives = dict(d.strip().partition(" ")[::2] for d in csp.split(";"))
    assert directives["script-src"] == "'self'", csp  # no inline script, no eval
    assert page.headers["x-content-type-options"] == "nosniff"
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), page.text
    linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert linked and all(url.startswith("/docs/assets/") for url in linked), linked
    for url in linked:
        asset = await http.get(url)
        assert asset.status_code == 200 and asset.content, url
        assert "frame-ancestors 'none'" in asset.headers["content-security-policy"], url
        assert asset.headers["x-content-type-options"] == "nosniff", url
    for name in STOCK:
        stock = await http.get(f"/docs/assets/{name}")
        assert_problem(stock, 404, "not_found")


def test_the_docs_render_under_their_policy(gateway: Gateway, browser: Chrome) -> None:
    browser.get(f"{gateway.url}/docs")
    wait = WebDriverWait(browser, WAIT_S)
    title = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".swagger-ui .title")))
    assert "irrev" in title.text.lower(), title.text
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))
    refused = [
        entry["message"]
        for entry in browser.get_log("browser")
        if "Content Security Policy" in entry["message"]
    ]
    assert refused == [], refused
