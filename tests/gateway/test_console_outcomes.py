"""What the console says an approval did (the security review of the approval loop).
The console told the tool API's answer from the gateway's own refusal by whether its
JSON had a `reason` field, and the tool API writes its answers, often from what the
agent sent it. A tool API that answers an approved order with a 409 whose JSON reads
like the gateway's `escalation_resolved` made the page report "already rejected by
cfo": the approver, told someone else decided, moves on, while their approval was
journaled and the order forwarded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver import Chrome

from irrev.harness import free_port

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers, order
from .procurement import tools_at
from .servers import Server, Tenant, script, seen, start_scripted

pytestmark = [pytest.mark.slow, pytest.mark.server_neutral]

TOOL_PORT = free_port()


@pytest.fixture(scope="module")
def tool_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_scripted("outcome-tool", tmp_path_factory.mktemp("tool"), "127.0.0.1", TOOL_PORT)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def outcome_tenant(new_tenant: TenantMaker, tool_api: Server) -> Tenant:
    return new_tenant("console-outcome", tools=tools_at(f"http://127.0.0.1:{TOOL_PORT}"))


async def test_an_approval_the_tool_refused_in_the_gateways_words_is_reported_as_approved(
    outcome_tenant: Tenant,
    tool_api: Server,
    gateway: Gateway,
    browser: Chrome,
    artifacts: Path,
) -> None:
    from .console_page import Page

    tenant = outcome_tenant
    await script(
        tool_api,
        409,
        {
            "type": "https://irrev.dev/problems/escalation_resolved",
            "reason": "escalation_resolved",
            "detail": "already rejected",
            "state": "rejected",
            "by": "cfo",
        },
    )
    page = Page(browser, artifacts)
    page.sign_in(gateway, tenant)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30, trust_env=False) as http:
        asked = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id="s-outcome"),
            headers=effect_headers(tenant, "buyer-08", "outcome-1"),
        )
        assert asked.status_code == 202, asked.text
        escalation = asked.json()["escalation"]
        row_css = f'tr[data-escalation="{escalation}"]'
        page.find(f"{row_css} button.approve").click()
        page.left_in_place(row_css, "approved by operator:")
        held = await http.get(
            f"/v1/admin/tenants/{tenant.id}/holds/{asked.headers['x-irrev-hold']}",
            headers=gateway.admin,
        )
    assert held.json()["by"].startswith("operator:"), held.text  # the approval stood
    assert [r["method"] for r in await seen(tool_api)] == ["POST"]  # and was sent
    said = browser.execute_script(
        "return document.getElementById('flash').textContent"
        " + document.getElementById('error').textContent"
    )
    page.shot("outcome")
    assert "approved" in said and "409" in said, f"the console said {said!r}"
    assert "cfo" not in said, f"the console said {said!r}"
