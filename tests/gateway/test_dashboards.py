"""deploy/: the Prometheus alert rules pass `promtool` (check and unit tests), and
neither they nor the Grafana dashboard name a series, or a label of one, that a live
gateway does not export (issue 14, "Dashboards")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers, order, scrape_fleet, scrape_hosts
from .servers import ROOT, Tenant


@pytest.fixture(scope="module")
def dashboards_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("dashboards")


DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "irrev.json"
RULES = DEPLOY / "prometheus"
SELECTOR = re.compile(r"(irrev_[a-z0-9_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must check the alert rules: apt install prometheus", pytrace=False)
        pytest.skip("no promtool (Debian package prometheus)")
    return found


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
        ["check", "config", "--syntax-only", "prometheus.yml"],
    ],
    ids=["check-rules", "test-rules", "check-config"],
)
def test_promtool_passes_the_rules(argv: list[str]) -> None:
    result = subprocess.run(
        [promtool(), *argv], cwd=RULES, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def dashboard_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return [p for p in panels if p["type"] != "row"]


def test_the_dashboard_is_well_formed() -> None:
    data = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    variables = {v["name"] for v in data["templating"]["list"]}
    assert variables == {"datasource", "tenant"}


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard target and variable and every alert."""
    found = [
        (f"dashboard panel {panel['title']!r}", target["expr"])
        for panel in dashboard_panels()
        for target in panel["targets"]
    ]
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"dashboard variable {variable['name']}", variable["definition"]))
    for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']}", rule["expr"]))
    return found


async def drive(tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient) -> None:
    """Something of everything the dashboard shows: an admitted effect, escalations
    approved, rejected and one left waiting, a refusal, a reconciliation."""
    admitted = await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-01", "d1")
    )
    assert admitted.status_code == 201, admitted.text
    escalated = [
        await http.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id=f"s-{agent}"),
            headers=effect_headers(tenant, agent, "d2"),
        )
        for agent in ("buyer-02", "buyer-03", "buyer-04")
    ]
    assert [r.status_code for r in escalated] == [202, 202, 202]
    for response, verb in zip(escalated, ("approve", "reject"), strict=False):
        decided = await http.post(f"{response.headers['location']}/{verb}", headers=gateway.admin)
        assert decided.status_code in (200, 201), decided.text
    refused = await http.post(
        "/tools/supplier/nowhere", json=order(), headers=effect_headers(tenant, "buyer-01", "d3")
    )
    assert refused.status_code == 403
    reconciled = await http.post(f"/v1/admin/tenants/{tenant.id}/reconcile", headers=gateway.admin)
    assert reconciled.status_code == 200, reconciled.text


async def test_dashboard_and_alerts_read_only_series_a_live_gateway_exports(
    dashboards_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = dashboards_tenant
    await drive(tenant, gateway, http)
    # The tenant's fleet gauges come from the gateway whose worker holds its sweep
    # lease: once they are exported, every series the dashboard reads is.
    waiting = f'irrev_live_holds{{state="escalated",tenant="{tenant.id}"}}'
    assert waiting in await scrape_fleet(http, gateway.admin, waiting)
    labels: dict[str, set[str]] = {}
    for text in await scrape_hosts(http, gateway.admin):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
    missing = []
    for where, query in queries():
        for name, matchers in SELECTOR.findall(query):
            if name not in labels:
                missing.append(f"{where}: {name}")
                continue
            unknown = set(MATCHER.findall(matchers)) - labels[name]
            if unknown:
                missing.append(f"{where}: {name} has no label {sorted(unknown)}")
    assert not missing, "\n".join(missing)


def test_the_rules_directory_is_what_the_scrape_config_loads() -> None:
    config = yaml.safe_load((RULES / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert all((RULES / name).is_file() for name in config["rule_files"])
    assert Path(DASHBOARD).is_file()
