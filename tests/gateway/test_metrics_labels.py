"""/metrics names admins and tools only to an operator's token, as it names tenants,
and a rule's approvals are one `admin="rule"` series however many rules come and go
(the rule's id is in the log line and the journal). On a real gateway and Redis."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Gateway, own_gateway
from .helpers import effect_headers, order
from .servers import Server

BIG = 450  # 450 x 100 USD: priced above the orders route's 30,000 USD approval threshold
RULES = 3


@pytest.fixture(scope="module")
def labels_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("labels")
    with own_gateway(redis_url, suppliers, root, 1) as gateway:
        yield gateway


def test_admin_and_tool_labels_are_for_operators_and_rules_are_one_series(
    labels_gateway: Gateway,
) -> None:
    """Before: anyone's scrape showed admin="operator:ops" and one admin="rule:r-..." series
    per rule that ever approved, and tool="supplier"."""
    gw, tenant = labels_gateway, labels_gateway.tenant("own")
    rules = f"/v1/admin/tenants/{tenant.id}/rules"
    with httpx.Client(base_url=gw.url, timeout=30, trust_env=False) as http:
        waiting = http.post(
            "/tools/supplier/orders",
            json=order(quantity=BIG),
            headers=effect_headers(tenant, "buyer-01", "by-hand"),
        )
        assert waiting.status_code == 202, waiting.text
        approved = http.post(
            f"/v1/escalations/{waiting.json()['escalation']}/approve", headers=gw.admin
        )
        assert approved.status_code == 201, approved.text
        for i in range(RULES):
            spec = {
                "kind": "auto_approve",
                "agent": f"buyer-0{i + 2}",
                "max_price": "50000",
                "duration": "1h",
                "reason": f"restock {i}",
            }
            rule = http.post(rules, json=spec, headers=gw.admin)
            assert rule.status_code == 201, rule.text
            auto = http.post(
                "/tools/supplier/orders",
                json=order(quantity=BIG, supplier_id=f"s-rule-{i}"),
                headers=effect_headers(tenant, f"buyer-0{i + 2}", f"by-rule-{i}"),
            )
            assert auto.status_code == 201, auto.text
            gone = http.delete(f"{rules}/{rule.json()['rule']}", headers=gw.admin)
            assert gone.status_code in (200, 204), gone.text
        anyone = http.get("/metrics").text
        operator = http.get("/metrics", headers=gw.admin).text
    decisions = re.compile(r"^irrev_admin_decisions_total\{(.*)\} (\S+)$", re.M)
    assert decisions.findall(anyone) == [('decision="approved"', f"{RULES + 1}.0")]
    assert 'admin="' not in anyone and 'tool="' not in anyone
    assert "irrev_upstream_seconds_count " in anyone  # summed over tools, still there
    seen = {labels: value for labels, value in decisions.findall(operator)}
    assert seen == {
        f'admin="operator:ops",decision="approved",tenant="{tenant.id}"': "1.0",
        f'admin="rule",decision="approved",tenant="{tenant.id}"': f"{RULES}.0",
    }
    assert 'tool="supplier"' in operator
    # The rule's id is in the log line that says who approved.
    approvals = [e for e in gw.log_entries() if e["msg"] == "escalation approved"]
    assert sum(str(e["admin"]).startswith("rule:") for e in approvals) == RULES
