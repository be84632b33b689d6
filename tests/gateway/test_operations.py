"""Operating the gateway (issue 14): what /metrics, the log, /readyz and /docs tell an
operator, against real `irrev serve` processes and a real Redis.

- every refusal is counted by reason wherever it happens, before the ledger too;
- budget gauges per account, the escalation queue's depth, age and time left, admin
  decisions, HTTP RED by route template, build info;
- a structured log line per decision, approval and rejection (with the admin's reason);
- a broken policy file: logged once per change, a metric, /readyz degraded (naming
  the tenant to admins only), and other tenants' changes still applied;
- /docs without internet, and an OpenAPI document with the bearer scheme, the
  Idempotency-Key and problem+json answers.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pricing.money import money_text

from .conftest import Gateway, TenantMaker, own_gateway
from .helpers import assert_problem, effect_headers, order, scrape_fleet
from .servers import Server, Tenant, write_policy

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ops_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("ops")


USD = 1_000_000


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def scrape(http: httpx.AsyncClient, headers: dict[str, str] | None = None) -> str:
    response = await http.get("/metrics", headers=headers or {})
    assert response.status_code == 200, response.text
    return response.text


async def test_every_refusal_is_counted_by_reason_wherever_it_happens(
    ops_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = ops_tenant
    before = samples(await scrape(http, gateway.admin))
    refusals = [
        # Before the ledger: the route, the amount, the agent's per-effect cap, the key.
        (
            await http.post(
                "/tools/supplier/nowhere",
                json=order(),
                headers=effect_headers(tenant, "buyer-01", "r1"),
            ),
            403,
            "unknown_route",
        ),
        (
            await http.post(
                "/tools/supplier/orders",
                json=order(unit_price="lots"),
                headers=effect_headers(tenant, "buyer-01", "r2"),
            ),
            422,
            "bad_amount",
        ),
        (
            await http.post(
                "/tools/supplier/orders",
                json=order(quantity=600),
                headers=effect_headers(tenant, "buyer-01", "r3"),
            ),
            403,
            "per_effect_cap",
        ),
        (
            await http.post(
                "/tools/supplier/orders", json=order(), headers=tenant.auth("buyer-01")
            ),
            400,
            "idempotency_key_required",
        ),
    ]
    for response, status, reason in refusals:
        assert_problem(response, status, reason)
    after = samples(await scrape(http, gateway.admin))
    for _, status, reason in refusals:
        labels = {"tenant": tenant.id, "reason": reason, "status": str(status)}
        counted = value(after, "irrev_refusals_total", **labels)
        assert counted - value(before, "irrev_refusals_total", **labels) == 1, (reason, counted)
    # Authentication: no tenant is known, and the refusal is still counted.
    anonymous = await http.post(
        "/tools/supplier/orders", json=order(), headers={"Idempotency-Key": "x"}
    )
    assert_problem(anonymous, 401, "unauthenticated")
    labels = {"tenant": "", "reason": "unauthenticated", "status": "401"}
    assert value(
        samples(await scrape(http, gateway.admin)), "irrev_refusals_total", **labels
    ) > value(after, "irrev_refusals_total", **labels)
    # Each refusal is a log line naming tenant, agent, route and reason.
    logged = [
        e
        for e in gateway.log_entries()
        if e.get("msg") == "refused" and e.get("tenant") == tenant.id
    ]
    assert {e["reason"] for e in logged} >= {reason for _, _, reason in refusals}
    assert all(
        e["agent"] == "buyer-01" and e["route"] == "/tools/{tool}/{path:path}" for e in logged
    )


async def test_budgets_queue_admin_decisions_and_red_by_route(
    ops_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = ops_tenant
    admitted = await http.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-02", "b1")
    )
    assert admitted.status_code == 201, admitted.text
    price = int(admitted.headers["x-irrev-price"])
    waiting = [
        await http.post(
            "/tools/supplier/orders",
            json=order(quantity=450, supplier_id=f"s-{agent}"),
            headers=effect_headers(tenant, agent, "e"),
        )
        for agent in ("buyer-03", "buyer-04", "buyer-05")
    ]
    assert [r.status_code for r in waiting] == [202, 202, 202], [r.text for r in waiting]

    limits = f'irrev_budget_limit_micros{{tenant="{tenant.id}"'
    found = samples(await scrape_fleet(http, gateway.admin, limits))
    account = {"tenant": tenant.id, "account": f"tenant:{tenant.id}"}
    limit = value(found, "irrev_budget_limit_micros", **account)
    pending = value(found, "irrev_budget_pending_micros", **account)
    posted = value(found, "irrev_budget_posted_micros", **account)
    assert limit == 250_000 * USD
    assert posted == price  # the admitted order was delivered and posted
    assert pending == sum(int(r.headers["x-irrev-price"]) for r in waiting)
    assert value(found, "irrev_budget_available_micros", **account) == limit - pending - posted
    principal = {"tenant": tenant.id, "account": "principal:procurement"}
    assert value(found, "irrev_budget_limit_micros", **principal) == 200_000 * USD
    # Agents' accounts are behind IRREV_METRICS_AGENT_ACCOUNTS.
    assert not [k for k in found if k[0].startswith("irrev_budget") and "agent:" in str(k[1])]
    queue = {"tenant": tenant.id}
    assert value(found, "irrev_live_holds", tenant=tenant.id, state="escalated") == 3
    assert value(found, "irrev_escalation_oldest_age_seconds", **queue) >= 0
    left = value(found, "irrev_escalation_next_expiry_seconds", **queue)
    assert 0 < left <= 30 * 60  # the example's escalation_ttl
    assert value(found, "irrev_ambiguous_oldest_age_seconds", **queue) == 0

    # Approvals and rejections by admin, each with a log line.
    for response, verb in zip(waiting, ("approve", "reject", "approve"), strict=True):
        decided = await http.post(
            f"{response.headers['location']}/{verb}",
            json={"reason": f"{verb}: checked with the budget owner"},
            headers=gateway.admin,
        )
        assert decided.status_code in (200, 201), decided.text
    found = samples(await scrape(http, gateway.admin))
    by_ops = {"tenant": tenant.id, "admin": "operator:ops"}
    assert value(found, "irrev_admin_decisions_total", **by_ops, decision="approved") == 2
    assert value(found, "irrev_admin_decisions_total", **by_ops, decision="rejected") == 1
    assert value(found, "irrev_live_holds", tenant=tenant.id, state="escalated") == 0
    assert ("irrev_escalation_next_expiry_seconds", frozenset(queue.items())) not in found
    holds = {r.headers["x-irrev-hold"]: r for r in waiting}
    lines = [e for e in gateway.log_entries() if e.get("tenant") == tenant.id]
    resolved = {e["hold_id"]: e for e in lines if e["msg"].startswith("escalation ")}
    assert {h: e["msg"] for h, e in resolved.items()} == {
        hold: f"escalation {'rejected' if i == 1 else 'approved'}" for i, hold in enumerate(holds)
    }
    for (hold, response), agent in zip(
        holds.items(), ("buyer-03", "buyer-04", "buyer-05"), strict=True
    ):
        assert resolved[hold]["admin"] == "operator:ops" and resolved[hold]["agent"] == agent
        assert resolved[hold]["price"] == int(response.headers["x-irrev-price"])
        assert resolved[hold]["route"] == "supplier POST /orders"
        verb = "reject" if resolved[hold]["msg"] == "escalation rejected" else "approve"
        assert resolved[hold]["reason"] == f"{verb}: checked with the budget owner"
    [decision] = [
        e
        for e in lines
        if e["msg"] == "decision" and e["hold_id"] == admitted.headers["x-irrev-hold"]
    ]
    assert decision["agent"] == "buyer-02" and decision["route"] == "supplier POST /orders"
    assert (decision["decision"], decision["reason"], decision["price"]) == (
        "admit",
        "within_budget",
        price,
    )

    # The reserve's journal entry, read through the admin API, says what was paid to
    # whom (the digest's recipe: tests/gateway/test_admission.py).
    journal = await http.get(
        f"/v1/admin/tenants/{tenant.id}/journal",
        params={"count": 1000},
        headers=gateway.admin,
    )
    [reserve] = [
        e
        for e in journal.json()["entries"]
        if e["op"] == "reserve" and e["hold"] == admitted.headers["x-irrev-hold"]
    ]
    assert (reserve["route"], reserve["agent"], reserve["principal"]) == (
        "supplier POST /orders",
        "buyer-02",
        "procurement",
    )
    assert (reserve["agent_key"], reserve["face_value"]) == ("b1", str(10 * 100 * USD))
    assert re.fullmatch(r"[0-9a-f]{64}", reserve["request_sha256"])
    # Amounts as a person reads them beside the stored integers: the face value and
    # each account's change, in the tenant's currency.
    assert (reserve["face_value_text"], reserve["currency"]) == ("1,000 USD", "USD")
    changes = {c["account"]: c for c in reserve["changes"]}
    assert changes[f"tenant:{tenant.id}"] == {
        "account": f"tenant:{tenant.id}",
        "pending": price,
        "pending_text": money_text(price, USD, "USD"),
        "posted": 0,
        "posted_text": "0 USD",
    }
    [post] = [
        e
        for e in journal.json()["entries"]
        if e["op"] == "post" and e["hold"] == admitted.headers["x-irrev-hold"]
    ]
    moved = {c["account"]: c for c in post["changes"]}[f"tenant:{tenant.id}"]
    assert (moved["pending"], moved["posted_text"]) == (-price, money_text(price, USD, "USD"))

    # HTTP RED by route template, never by raw path.
    route = {"method": "POST", "route": "/tools/{tool}/{path:path}"}
    assert value(found, "irrev_http_requests_total", **route, status="201") >= 1
    assert value(found, "irrev_http_requests_total", **route, status="202") >= 3
    assert value(found, "irrev_http_request_seconds_count", **route) >= 4
    assert not [k for k in found if k[0] == "irrev_http_requests_total" and "/orders" in str(k[1])]
    [build] = [k for k in found if k[0] == "irrev_build_info"]
    assert dict(build[1])["version"]


async def test_agent_accounts_are_reported_with_the_switch(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    with own_gateway(
        redis_url, suppliers, tmp_path, 1, IRREV_METRICS_AGENT_ACCOUNTS="true"
    ) as gateway:
        tenant = gateway.tenant("own")
        async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:
            admitted = await http.post(
                "/tools/supplier/orders",
                json=order(),
                headers=effect_headers(tenant, "buyer-01", "a"),
            )
            assert admitted.status_code == 201, admitted.text
            found = samples(await scrape(http, gateway.admin))
    agent = {"tenant": tenant.id, "account": "agent:buyer-01"}
    assert value(found, "irrev_budget_limit_micros", **agent) == 100_000 * USD
    assert value(found, "irrev_budget_posted_micros", **agent) == int(
        admitted.headers["x-irrev-price"]
    )


async def test_strangers_see_no_tenant_account_or_version(
    ops_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """The gauges that name accounts (whose ids carry tenant ids) or versions, or do
    not add up over tenants (ages), are an admin's; a stranger gets sums."""
    tenant = ops_tenant
    text = await scrape(http)
    assert tenant.id not in text and "tenant=" not in text and "account=" not in text
    names = {name for name, _ in samples(text)}
    assert "irrev_refusals_total" in names and "irrev_http_requests_total" in names
    assert not {
        n for n in names if n.startswith(("irrev_budget", "irrev_escalation", "irrev_policy_info"))
    }
    # Nothing fails to load on the shared gateway: ready, and no count of failing files.
    readyz = await http.get("/readyz")
    assert readyz.json() == {"status": "ready"}


def _edit(path: Path, change: Any) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


async def _until(check: Any, what: str, deadline_s: float = 20.0) -> Any:
    deadline = time.monotonic() + deadline_s
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_broken_policy_file_is_reported_once_and_blocks_no_other_tenant(
    redis_url: str, suppliers: Server, tmp_path: Path
) -> None:
    """Observation: a bad file logged a traceback every 2 s, /readyz stayed green and
    no tenant's change was applied until it was fixed."""
    workers = 2
    with own_gateway(
        redis_url, suppliers, tmp_path, workers, IRREV_POLICY_CHECK_INTERVAL_S="0.2"
    ) as gateway:
        broken = gateway.tenant("own")
        policies = gateway.policy_dir
        other = write_policy(
            policies, "procurement", f"{broken.id}-b", f"{suppliers.url}/{broken.id}-b"
        )
        async with httpx.AsyncClient(base_url=gateway.url, trust_env=False, timeout=30) as http:

            async def limit_of(tenant_id: str, account: str) -> float:
                found = samples(await scrape(http, gateway.admin))
                return value(found, "irrev_budget_limit_micros", tenant=tenant_id, account=account)

            await _until(lambda: limit_of(other.id, "principal:facilities"), "the new tenant")
            broken_file = policies / f"{broken.id}.yaml"
            broken_file.write_text(broken_file.read_text() + "\nrouts: [\n")
            _edit(
                policies / f"{other.id}.yaml",
                lambda d: d["accounts"]["principals"]["facilities"].update(limit="61000"),
            )

            async def both_workers_saw_it() -> bool:
                lines = [e for e in gateway.log_entries() if e.get("msg") == "policy not applied"]
                return len(lines) >= workers

            await _until(both_workers_saw_it, "every worker to log the broken file")
            # The other tenant's change is applied all the same (by every worker).
            for _ in range(4):
                await _until(
                    lambda: _is(limit_of(other.id, "principal:facilities"), 61_000 * USD),
                    "the other tenant's change",
                )
            await asyncio.sleep(1.0)  # five more looks at the directory by each worker
            lines = [e for e in gateway.log_entries() if e.get("msg") == "policy not applied"]
            assert len(lines) == workers, lines
            assert all(e["tenant"] == broken.id and e["file"] == str(broken_file) for e in lines)
            assert all("not valid YAML" in " ".join(e["problems"]) for e in lines)
            assert not [e for e in gateway.log_entries() if e.get("level") == "error"]

            # The broken tenant is served by the policy it had.
            served = await http.post(
                "/tools/supplier/orders",
                json=order(),
                headers=effect_headers(broken, "buyer-01", "k"),
            )
            assert served.status_code == 201, served.text
            anonymous = await http.get("/readyz")
            assert anonymous.status_code == 200
            assert anonymous.json() == {"status": "degraded", "policy_files_failing": 1}
            operator = (await http.get("/readyz", headers=gateway.admin)).json()
            assert operator["tenants_degraded"] == [broken.id]
            assert operator["files_failing"] == [str(broken_file)]
            found = samples(await scrape(http, gateway.admin))
            assert value(found, "irrev_policy_failing", tenant=broken.id) == 1
            assert value(found, "irrev_policy_failing", tenant=other.id) == 0
            assert (
                value(found, "irrev_policy_reloads_total", tenant=broken.id, result="failed") >= 1
            )
            assert broken.id not in await scrape(http)

            # Fixed: ready again, and the fix is a log line.
            broken_file.write_text(broken_file.read_text().replace("\nrouts: [\n", "\n"))
            await _until(lambda: _json_is(http.get("/readyz"), {"status": "ready"}), "ready again")
            applied = [
                e
                for e in gateway.log_entries()
                if e.get("msg") == "policy applied" and e["tenant"] == broken.id
            ]
            assert applied and all(re.fullmatch(r"[0-9a-f]{12}", e["version"]) for e in applied)
            # In force: the fixed file's version, and its reload counted as applied.
            fixed = applied[-1]["version"]

            async def in_force() -> bool:
                found = samples(await scrape(http, gateway.admin))
                return value(found, "irrev_policy_info", tenant=broken.id, version=fixed) == 1

            await _until(in_force, "the fixed version as irrev_policy_info")
            found = samples(await scrape(http, gateway.admin))
            assert [
                dict(labels)["version"]
                for name, labels in found
                if name == "irrev_policy_info" and dict(labels)["tenant"] == broken.id
            ] == [fixed]
            assert value(found, "irrev_policy_reloads_total", tenant=broken.id, result="applied")
            assert value(found, "irrev_policy_failing", tenant=broken.id) == 0


async def _is(pending: Any, expected: float) -> bool:
    return bool(await pending == expected)


async def _json_is(pending: Any, expected: dict[str, Any]) -> bool:
    response = await pending
    return bool(response.json() == expected)


async def test_docs_work_without_internet_and_the_openapi_says_how_to_call(
    gateway: Gateway, http: httpx.AsyncClient
) -> None:
    page = await http.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert urls, page.text
    for url in urls:
        assert url.startswith("/"), f"/docs loads {url} from elsewhere"
        asset = await http.get(url)
        assert asset.status_code == 200 and asset.content, url
    schema = (await http.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        **schema["components"]["securitySchemes"]["bearer"],
        "type": "http",
        "scheme": "bearer",
    }
    paths = schema["paths"]
    for path, method in (
        ("/v1/holds", "post"),
        ("/tools/{tool}/{path}", "post"),
        ("/tools/{tool}/{path}", "delete"),
    ):
        [key] = [p for p in paths[path][method]["parameters"] if p["name"] == "Idempotency-Key"]
        assert key["in"] == "header" and key["required"] is True
    assert not [
        p
        for p in paths["/tools/{tool}/{path}"]["get"]["parameters"]
        if p["name"] == "Idempotency-Key"
    ]
    for decided in ("approve", "reject"):  # the reason, read after the role check
        body = paths[f"/v1/escalations/{{escalation}}/{decided}"]["post"]["requestBody"]
        reason = body["content"]["application/json"]["schema"]["properties"]["reason"]
        assert reason["maxLength"] == 500 and body["required"] is False
    for path, field in (  # read by hand, within the tenant's request limits
        ("/v1/holds", "tool"),
        ("/v1/holds/{hold_id}/post", "amount_micros"),
        ("/v1/holds/{hold_id}/ambiguous", "reason"),
        ("/v1/holds/{hold_id}/compensate", "recovered_micros"),
        ("/v1/holds/{hold_id}/settle", "realised_micros"),
    ):
        body = paths[path]["post"]["requestBody"]
        spec = body["content"]["application/json"]["schema"]
        assert field in spec["properties"] and spec["additionalProperties"] is False, path
    problem = {"$ref": "#/components/schemas/Problem"}
    for path, operations in paths.items():
        for method, operation in operations.items():
            refused = operation["responses"]["4XX"]["content"]["application/problem+json"]
            assert refused["schema"] == problem, (path, method)
            assert "422" not in operation["responses"], (path, method)
            if path.startswith(("/v1/", "/tools/")):
                assert operation["security"] == [{"bearer": []}], (path, method)
    assert set(schema["components"]["schemas"]["Problem"]["required"]) >= {
        "status",
        "reason",
        "detail",
    }
