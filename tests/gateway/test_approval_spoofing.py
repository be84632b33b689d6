"""What a person approving an escalation reads is what an approval sends (the security
review of the approval loop): a hostile agent writes the path parameters of its
request, so it must not be able to make the request line the queue shows (the admin
API's `target`, which the console and `irrev escalations list` print) read as another
request than the one forwarded. The agent sends a path parameter holding a
percent-encoded '?', '#' or spaces: decoded for display, the line read
`POST /orders/o-7?dry_run=true/cancel` (a harmless-looking dry run), while the
upstream got `/orders/o-7%3Fdry_run=true/cancel`, one path segment: a real
cancellation. The line is now the path as sent, percent-encoded."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers
from .servers import EXAMPLES, Tenant

# Every cancellation waits for a person (its fee of 50 USD is above 1 USD).
THRESHOLD = "1"


def _routes() -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = yaml.safe_load((EXAMPLES / "procurement.yaml").read_text())[
        "routes"
    ]
    for route in routes:
        if route["route"] == "POST /orders/{order_id}/cancel":
            route["approval_threshold"] = THRESHOLD
    return routes


@pytest.fixture(scope="module")
def spoof_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("spoof", routes=_routes())


# The agent's raw path parameters (as sent on the wire), each made to read, once
# decoded, as something the upstream never gets: a query that is not one, a fragment,
# words after spaces (no-break ones too, which HTML does not collapse), text reordered
# by a bidi override, a zero-width space. The last two the gateway refuses at the door
# (pricing.reading.check_request_path; a line break never matches the proxy's route);
# the others it admitted and showed decoded.
SPOOFS = {
    "query": "o-7%3Fdry_run=true",
    "fragment": "o-7%23dry-run",
    "spaces": "o-7%20%20%20(test%20order,%20not%20sent)",
    "no-break spaces": "o-7%C2%A0%E2%80%83(dry%C2%A0run)",
    "bidi": "o-7%E2%80%AEnur-yrd",
    "zero-width": "o-%E2%80%8B7",
}


def _deceptive(text: str) -> list[str]:
    """The characters of `text` a person cannot read for what they are: a '?' or '#'
    in a path (it reads as a query or a fragment), whitespace, and control, format
    (bidi overrides, zero-width) and separator characters."""
    path = text.partition(" ")[2]
    return [
        c for c in path if c in "?# " or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Zs")
    ]


@pytest.mark.parametrize("spoof", sorted(SPOOFS))
async def test_the_queue_shows_the_request_line_an_approval_sends_byte_for_byte(
    spoof: str, spoof_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    tenant = spoof_tenant
    raw = SPOOFS[spoof]
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        asked = await http.post(
            f"/tools/supplier/orders/{raw}/cancel",
            json={"supplier_id": "s-spoof", "cancellation_fee": "50"},
            headers=effect_headers(tenant, "buyer-04", f"spoof-{spoof.replace(' ', '-')}"),
        )
        if asked.status_code == 422:
            # Refused before anything was held: nothing waits to be misread.
            assert asked.json()["reason"] == "bad_request", asked.text
            return
        assert asked.status_code == 202, asked.text
        escalation = asked.json()["escalation"]
        queue = await http.get(f"/v1/admin/tenants/{tenant.id}/escalations", headers=gateway.admin)
        assert queue.status_code == 200, queue.text
        [item] = [i for i in queue.json()["escalations"] if i["escalation"] == escalation]
        shown = item["target"]
        # The same line on the hold's own page, which the console's body view reads.
        held = await http.get(
            f"/v1/admin/tenants/{tenant.id}/holds/{item['hold']}", headers=gateway.admin
        )
        assert held.status_code == 200, held.text
        assert held.json()["target"] == shown

        before = len((await upstream.get(f"/_seen/{tenant.id}")).json())
        approved = await http.post(f"/v1/escalations/{escalation}/approve", headers=gateway.admin)
        assert approved.status_code < 500, approved.text

    seen = (await upstream.get(f"/_seen/{tenant.id}")).json()[before:]
    prefix = f"/{tenant.id}"
    forwarded = [f"{method} {path.removeprefix(prefix)}" for method, path in seen]
    assert forwarded, "the approval forwarded nothing"
    # What the approver read is the very request line the upstream received, and
    # nothing in it can be read as something else.
    assert shown in forwarded, f"the queue showed {shown!r}; the upstream got {forwarded}"
    assert not _deceptive(shown), f"{shown!r} shows {_deceptive(shown)} to the approver"


@pytest.mark.slow
def test_the_console_shows_the_path_an_approval_sends_not_a_query_the_agent_wrote(
    spoof_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    """The same in the operator's page: the row's request line is the one sent."""
    from .console_page import Page

    tenant = spoof_tenant
    page = Page(browser, artifacts)
    page.sign_in(gateway, tenant)
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        asked = http.post(
            "/tools/supplier/orders/o-9%3Fdry_run=true/cancel",
            json={"supplier_id": "s-spoof", "cancellation_fee": "50"},
            headers=effect_headers(tenant, "buyer-05", "spoof-console"),
        )
        assert asked.status_code == 202, asked.text
        row = f'tr[data-escalation="{asked.json()["escalation"]}"]'
        page.text_is(f"{row} td.route div.target", "POST /orders/o-9%3Fdry_run=true/cancel")
        page.shot("encoded-target")


# In view: the cell's right edge within the window (a pixel of rounding allowed).
_IN_VIEW = """
const box = arguments[0].getBoundingClientRect();
return box.right <= window.innerWidth + 1 && box.width > 0;
"""


@pytest.mark.slow
def test_a_long_path_does_not_push_the_amounts_and_buttons_of_the_queue_off_screen(
    spoof_tenant: Tenant, gateway: Gateway, browser: Chrome, artifacts: Path
) -> None:
    """One escalation whose path parameter is thousands of characters without a
    space widened the route column of the whole queue: every row's face value, price
    and Approve button were pushed past the window's edge, so an approver saw who
    asked and which route, and had to scroll sideways, past the agent's text, to
    find what each effect costs."""
    from .console_page import Page

    tenant = spoof_tenant
    page = Page(browser, artifacts)
    page.sign_in(gateway, tenant)
    rows = []
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as http:
        for key, order_id in (("plain", "o-10"), ("long", "o-" + "x" * 3000)):
            asked = http.post(
                f"/tools/supplier/orders/{order_id}/cancel",
                json={"supplier_id": "s-spoof", "cancellation_fee": "50"},
                headers=effect_headers(tenant, "buyer-06", f"spoof-wide-{key}"),
            )
            assert asked.status_code == 202, asked.text
            rows.append(f'tr[data-escalation="{asked.json()["escalation"]}"]')
    for row in rows:
        page.find(f"{row} td.price")
    page.shot("long-path")
    for row in rows:
        for cell in ("td.face", "td.price", "button.approve", "button.reject"):
            element = browser.find_element(By.CSS_SELECTOR, f"{row} {cell}")
            assert browser.execute_script(_IN_VIEW, element), (
                f"{row} {cell} is off screen, at {element.rect}, in a window "
                f"{browser.execute_script('return window.innerWidth')} px wide"
            )
