"""Schema-driven fuzzing of the decision API, the admin API and the proxy with
hypothesis, against the real gateway: no 5xx from the gateway itself, every error a
problem+json with a reason, and afterwards no account over its limit and
`irrev ledger audit` clean for the fuzzed tenants."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Gateway, TenantMaker
from .helpers import PROBLEM_JSON, assert_problem, ledger_audit
from .servers import Tenant


@pytest.fixture(scope="module")
def fuzz_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("fuzz")


@pytest.fixture(scope="module")
def fuzz_globex_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("fuzz-globex", "globex")


EXAMPLES = 75
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
numbers = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["1e400", "-0", "0.0000001", "1_000", " 5", "NaN", "Infinity", "", "12abc"])
    | st.decimals(allow_nan=False, allow_infinity=False).map(str)
)
# h11 refuses to send a header value with surrounding blanks.
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(
    str.strip
)
url_text = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=20)
ids = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"),
    min_size=1,
    max_size=60,
)


def body_of(value: Any) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.request.url, response.text)
    if response.status_code >= 400:
        assert response.headers["content-type"] == PROBLEM_JSON, response.text
        assert_problem(response, response.status_code, response.json()["reason"])


def fuzz(gateway: Gateway, case: Callable[[httpx.Client], None]) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as client:
        case(client)


hold_specs = st.fixed_dictionaries(
    {
        "tool": st.sampled_from(["deploy", "supplier", "payments", ""]) | st.text(max_size=10),
        "method": st.sampled_from(["POST", "GET", "DELETE", "post"]),
        "path": st.sampled_from(["/deploys", "/orders", "/refunds", "/"]) | st.text(max_size=30),
    },
    optional={
        "query": st.dictionaries(
            st.text(max_size=8), st.text(max_size=8) | json_values, max_size=3
        ),
        "body": st.dictionaries(st.text(max_size=12), json_values, max_size=4) | json_values,
        "extra": json_values,
    },
)


def test_fuzz_decision_api(fuzz_tenant: Tenant, gateway: Gateway) -> None:
    tenant = fuzz_tenant

    @FUZZ
    @given(
        spec=hold_specs | json_values | st.binary(max_size=64),
        agent=st.sampled_from(["deployer-01", "buyer-01", "refunds-01"]),
        key=header_text,
        action=st.sampled_from(["post", "void", "ambiguous", "compensate", ""]),
        action_body=st.fixed_dictionaries(
            {},
            optional={
                "amount_micros": numbers,
                "recovered_micros": numbers,
                "reason": st.text(max_size=20),
            },
        )
        | json_values,
        other_id=ids,
    )
    def run(
        client: httpx.Client,
        spec: Any,
        agent: str,
        key: str,
        action: str,
        action_body: Any,
        other_id: str,
    ) -> None:
        headers = {**tenant.auth(agent), "Idempotency-Key": key, "Content-Type": "application/json"}
        created = client.post("/v1/holds", content=body_of(spec), headers=headers)
        check(created)
        hold = created.json()["hold"] if created.status_code in (200, 201, 202) else other_id
        target = f"/v1/holds/{hold}/{action}" if action else f"/v1/holds/{hold}"
        method = "POST" if action else "GET"
        check(client.request(method, target, content=body_of(action_body), headers=headers))

    fuzz(gateway, lambda client: run(client))
    assert_ledger_sound(gateway, tenant)


def test_fuzz_proxy(fuzz_tenant: Tenant, gateway: Gateway) -> None:
    tenant = fuzz_tenant

    @FUZZ
    @given(
        path=st.sampled_from(["orders", "orders/o-1/cancel", "catalog", "refunds"]) | url_text,
        method=st.sampled_from(["POST", "GET", "PUT", "PATCH", "DELETE"]),
        body=st.fixed_dictionaries(
            {},
            optional={
                "supplier_id": st.sampled_from(["s1", "acme-steel"])
                | st.text(max_size=10)
                | json_values,
                "sku": st.text(max_size=8),
                "quantity": numbers,
                "unit_price": numbers,
                "cancellation_fee": numbers,
                "customer_id": st.text(max_size=8),
                "amount": numbers,
            },
        )
        | json_values
        | st.binary(max_size=32),
        key=header_text,
        query=url_text,
    )
    def run(client: httpx.Client, path: str, method: str, body: Any, key: str, query: str) -> None:
        headers = {
            **tenant.auth("buyer-02"),
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        }
        response = client.request(
            method, f"/tools/supplier/{path}", params=query, content=body_of(body), headers=headers
        )
        # The supplier may refuse (4xx, passed through) or fail on (5xx, answered as
        # ambiguous: 502) a body the gateway could price, e.g. a quantity it cannot parse.
        if response.headers["content-type"] != PROBLEM_JSON:
            assert response.headers["x-irrev-decision"] == "admit", response.text
        elif response.status_code >= 500:
            assert_problem(response, response.status_code, "upstream_ambiguous")
        else:
            check(response)

    fuzz(gateway, lambda client: run(client))
    assert_ledger_sound(gateway, tenant)


def test_fuzz_admin_api(fuzz_globex_tenant: Tenant, fuzz_tenant: Tenant, gateway: Gateway) -> None:
    tenant, other = fuzz_tenant, fuzz_globex_tenant
    tenant_names = st.sampled_from([tenant.id, other.id, "nobody", "a" * 65]) | ids
    query_value = (
        header_text
        | st.integers().map(str)
        | st.sampled_from(
            [
                "-",
                "0-0",
                "99999999999999999999-0",
                "18446744073709551615-18446744073709551615",
                "1-2-3",
            ]
        )
    )

    @FUZZ
    @given(
        name=tenant_names,
        route=st.sampled_from(
            ["balances", "journal", "holds", "escalations", "policy", "reconcile"]
        ),
        params=st.dictionaries(
            st.sampled_from(["after", "count", "state", "x"]), query_value, max_size=3
        ),
        text=st.text(max_size=200) | st.sampled_from(["tenant: x", "{}", "[", "kind: demo-tokens"]),
    )
    def run(client: httpx.Client, name: str, route: str, params: dict[str, str], text: str) -> None:
        path = f"/v1/admin/tenants/{name}/{route}"
        method = "POST" if route == "reconcile" else "GET"
        check(client.request(method, path, params=params, headers=gateway.admin))
        if route == "policy":
            check(client.put(path, content=text.encode(), headers=gateway.admin))

    fuzz(gateway, lambda client: run(client))
    assert_ledger_sound(gateway, tenant)


def assert_ledger_sound(gateway: Gateway, *tenants: Tenant) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30.0, trust_env=False) as client:
        for tenant in tenants:
            rows = client.get(f"/v1/admin/tenants/{tenant.id}/balances", headers=gateway.admin)
            over = [r for r in rows.json() if r["pending"] + r["posted"] > r["limit"]]
            assert over == []
    audit = ledger_audit(gateway.redis_url, *tenants)
    assert audit.returncode == 0, audit.stdout + audit.stderr
