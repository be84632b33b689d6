"""Forward exactly what was priced (issue 10, observations 5-8 and 11): a request that
another parser could read as a different method, route or amount is refused before
anything is held or sent; what is forwarded is re-encoded from what was priced.

The `readers-canon` tenant's upstream executes nothing and reports how several
real-world parsers read each request it got (irrev/upstreams/readers.py)."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import httpx
import pytest

from .conftest import Gateway, TenantMaker
from .helpers import PROBLEM_JSON, assert_problem, balances, raw_request, used
from .servers import Tenant

# How a request is read and re-encoded is decided before anything is held: the same on
# every server (admissions' holds run on the cluster in the admission suites).
pytestmark = pytest.mark.server_neutral

# Routes of `readers-canon`, whose upstream reports how several parsers read
# each request (irrev/upstreams/readers.py): amounts at face value, so a price is an amount.
READER_ROUTES: list[dict[str, Any]] = [
    {
        "tool": "payments",
        "route": "POST /refunds",
        "class": "irreversible",
        # `note`: a free-text field, declared (undeclared ones are refused).
        "body": ["customer_id", "amount", "note"],
        "face_value": "amount",
        "risk_factors": ["customer:{customer_id}"],
    },
    {
        "tool": "payments",
        "route": "POST /transfers",
        "class": "irreversible",
        "query": ["amount"],
        "face_value": "amount",
    },
    {
        "tool": "payments",
        "route": "POST /charges",
        "class": "irreversible",
        "body_format": "form",
        "body": ["customer_id", "amount", "currency"],
        "face_value": "amount",
        "amount_scale": 100,
        "currency_field": "currency",
        "risk_factors": ["customer:{customer_id}"],
    },
    {"tool": "payments", "route": "GET /refunds/{refund_id}", "class": "read"},
]
READERS: dict[str, Any] = {
    "routes": READER_ROUTES,
    "unknown_routes": {"action": "price_as_irreversible", "face_value": "amount"},
}


@pytest.fixture(scope="module")
def readers_canon_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("readers-canon", **READERS)


@pytest.fixture(scope="module")
def decision_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("decision")


FORM = "application/x-www-form-urlencoded"
REFUND = b'{"customer_id":"c1","amount":1}'


async def readings(upstream: httpx.AsyncClient, tenant_id: str) -> list[dict[str, Any]]:
    response = await upstream.get(f"/_readings/{tenant_id}")
    assert response.status_code == 200
    found: list[dict[str, Any]] = response.json()
    return found


async def send(
    tenant: Tenant,
    gateway: Gateway,
    method: str,
    target: str,
    body: bytes,
    content_type: str,
) -> tuple[int, dict[str, str], bytes]:
    headers = tenant.auth("buyer-01")
    if method != "GET":
        headers["Idempotency-Key"] = uuid.uuid4().hex
    if content_type:
        headers["Content-Type"] = content_type
    return await raw_request(gateway.url, method, f"/tools/payments{target}", headers, body)


REFUSED = [
    # (id, method, target, body, content type, status, reason)
    # 5: keys that collide case-insensitively (Go's encoding/json reads the last one)
    (
        "case-colliding-keys",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1,"Amount":7000}',
        "application/json",
        400,
        "bad_json",
    ),
    (
        "nested-case-colliding-keys",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1,"meta":{"note":"a","NOTE":"b"}}',
        "application/json",
        400,
        "bad_json",
    ),
    (
        "unicode-folded-keys",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","cu\\u017ftomer_id":"c2","amount":1}',
        "application/json",
        400,
        "bad_json",
    ),
    # 6: the query string on effect routes
    (
        "method-override-query",
        "POST",
        "/refunds?_method=DELETE",
        REFUND,
        "application/json",
        400,
        "method_override",
    ),
    (
        "amount-in-query-beside-body",
        "POST",
        "/refunds?amount=7000",
        REFUND,
        "application/json",
        400,
        "undeclared_query_parameter",
    ),
    ("semicolon-query", "POST", "/transfers?amount=1&x=1;amount=7000", b"", "", 400, "bad_query"),
    (
        "case-colliding-query",
        "POST",
        "/transfers?amount=1&Amount=7000",
        b"",
        "",
        400,
        "undeclared_query_parameter",
    ),
    (
        "query-field-also-in-body",
        "POST",
        "/transfers?amount=1",
        b'{"amount":7000}',
        "application/json",
        400,
        "ambiguous_field",
    ),
    (
        "method-override-body",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1,"_method":"DELETE"}',
        "application/json",
        400,
        "method_override",
    ),
    ("method-override-read", "GET", "/refunds/r1?_method=DELETE", b"", "", 400, "method_override"),
    ("semicolon-read", "GET", "/refunds/r1?a=1;_method=DELETE", b"", "", 400, "bad_query"),
    # 7: the content type
    (
        "form-profile-json",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1,"x":"&amount=7000&y="}',
        f"{FORM}; profile=json",
        415,
        "unsupported_media_type",
    ),
    ("text-json", "POST", "/refunds", REFUND, "text/json", 415, "unsupported_media_type"),
    (
        "json-with-parameter",
        "POST",
        "/refunds",
        REFUND,
        "application/json; x=1",
        415,
        "unsupported_media_type",
    ),
    (
        "json-to-a-form-route",
        "POST",
        "/charges",
        b'{"customer_id":"c1","amount":100,"currency":"usd"}',
        "application/json",
        415,
        "unsupported_media_type",
    ),
    # 8: paths an upstream normalises into another route
    ("dot-dot-semicolon", "POST", "/x/..;/refunds", REFUND, "application/json", 422, "bad_request"),
    ("matrix-parameter", "POST", "/refunds;v=2", REFUND, "application/json", 403, "route_alias"),
    ("encoded-semicolon", "POST", "/refunds%3Bv=2", REFUND, "application/json", 403, "route_alias"),
    ("case-alias", "POST", "/Refunds", REFUND, "application/json", 403, "route_alias"),
    ("extension-alias", "POST", "/refunds.json", REFUND, "application/json", 403, "route_alias"),
    # Rails' `.:format` takes any characters but '/' and '.', Spring's suffix pattern
    # anything after the first '.': both route these to /refunds, past its customer cap.
    ("format-alias-dash", "POST", "/refunds.x-y", REFUND, "application/json", 403, "route_alias"),
    (
        "format-alias-long",
        "POST",
        "/refunds.formatted",
        REFUND,
        "application/json",
        403,
        "route_alias",
    ),
    (
        "suffix-alias-dots",
        "POST",
        "/refunds.json.x",
        REFUND,
        "application/json",
        403,
        "route_alias",
    ),
    ("encoded-slash", "POST", "/x%2F..%2Frefunds", REFUND, "application/json", 422, "bad_request"),
    # 11: amounts no Decimal context holds
    (
        "huge-exponent",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1e999999}',
        "application/json",
        422,
        "bad_amount",
    ),
    (
        "tiny-exponent",
        "POST",
        "/refunds",
        b'{"customer_id":"c1","amount":1e-999999}',
        "application/json",
        422,
        "bad_amount",
    ),
    # form bodies, parsed strictly
    (
        "form-semicolon",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100;amount=700000",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-case-colliding",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&Amount=700000",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-bracket-alias",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&amount[]=700000",
        FORM,
        400,
        "bad_form",
    ),
    ("form-bad-escape", "POST", "/charges", b"customer_id=c%zz&amount=1", FORM, 400, "bad_form"),
    # PHP drops a name's leading spaces, cuts it at a NUL and reads an unclosed '[' as
    # '_'; Rack 2 drops brackets around a name: each reads another field than priced.
    (
        "form-php-leading-space",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&+amount=700000",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-php-nul",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&amount%00x=700000",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-php-unclosed-bracket",
        "POST",
        "/charges",
        b"customer_id=c1&customer[id=c2&currency=usd&amount=100",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-rack-bracketed-name",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&[amount]=700000",
        FORM,
        400,
        "bad_form",
    ),
    (
        "form-method-override",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100&_method=DELETE",
        FORM,
        400,
        "method_override",
    ),
    (
        "currency-mismatch",
        "POST",
        "/charges",
        b"customer_id=c1&currency=eur&amount=100",
        FORM,
        422,
        "currency_mismatch",
    ),
    (
        "fractional-minor-units",
        "POST",
        "/charges",
        b"customer_id=c1&currency=usd&amount=100.5",
        FORM,
        422,
        "bad_amount",
    ),
]


@pytest.mark.parametrize(
    ("method", "target", "body", "content_type", "status", "reason"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
async def test_a_request_other_parsers_read_differently_is_refused(
    readers_canon_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    method: str,
    target: str,
    body: bytes,
    content_type: str,
    status: int,
    reason: str,
) -> None:
    tenant = readers_canon_tenant
    before = await balances(http, gateway.admin, tenant)
    seen = len(await readings(upstream, tenant.id))
    got, headers, content = await send(tenant, gateway, method, target, body, content_type)
    assert (got, headers.get("content-type")) == (status, PROBLEM_JSON), content
    assert json.loads(content)["reason"] == reason, content
    assert headers.get("x-irrev-reason") == reason, headers
    assert len(await readings(upstream, tenant.id)) == seen
    assert used(await balances(http, gateway.admin, tenant)) == used(before)


async def forwarded(
    tenant: Tenant,
    gateway: Gateway,
    upstream: httpx.AsyncClient,
    target: str,
    body: bytes,
    content_type: str,
) -> tuple[int, dict[str, Any]]:
    """Send an honest effect; (its price, the one record the upstream made of it), after
    checking that every reader read the priced method, path and amount."""
    tenant_id = tenant.id
    seen = len(await readings(upstream, tenant_id))
    status, headers, content = await send(tenant, gateway, "POST", target, body, content_type)
    assert status == 201, content
    records = (await readings(upstream, tenant_id))[seen:]
    assert len(records) == 1
    price = int(headers["x-irrev-price"])
    path = target.partition("?")[0]
    scale = Decimal(100) if path == "/charges" else Decimal(1)
    for name, reading in records[0]["readings"].items():
        assert "amount" in reading["fields"], records[0]
        amount = Decimal(str(reading["fields"]["amount"])) / scale
        assert (reading["method"], reading["path"], amount * 10**6) == ("POST", path, price), name
    return price, records[0]


async def test_json_is_forwarded_as_parsed(
    readers_canon_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    body = b'{ "customer_id" : "c1",\n "amount" : 1.50 }'
    price, record = await forwarded(
        readers_canon_tenant, gateway, upstream, "/refunds", body, "Application/JSON; charset=UTF-8"
    )
    assert price == 1_500_000
    assert record["content_type"] == "application/json"
    # Keys sorted, no whitespace, the number's digits exactly as sent.
    assert record["body"] == '{"amount":1.50,"customer_id":"c1"}'


async def test_json_strings_hide_no_form_pairs(
    readers_canon_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    """A server that sniffs a form in any body (observation 7's other half) must not
    find `amount=7000` inside a JSON string: '&', '=' and ';' go out escaped."""
    body = b'{"customer_id":"c1","amount":1,"note":"&amount=7000&x=;amount=7000"}'
    price, record = await forwarded(
        readers_canon_tenant, gateway, upstream, "/refunds", body, "application/json"
    )
    assert price == 1_000_000
    assert "&" not in record["body"] and "=" not in record["body"]


async def test_declared_query_is_reencoded(
    readers_canon_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    price, record = await forwarded(
        readers_canon_tenant, gateway, upstream, "/transfers?amount=%32.5", b"", ""
    )
    assert price == 2_500_000
    assert (record["query"], record["body"]) == ("amount=2.5", "")


async def test_form_body_in_minor_units(
    readers_canon_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient
) -> None:
    body = b"customer_id=c%31&amount=1050&currency=USD"
    price, record = await forwarded(
        readers_canon_tenant, gateway, upstream, "/charges", body, f"{FORM}; charset=utf-8"
    )
    assert price == 10_500_000  # 1050 cents
    assert record["content_type"] == FORM
    assert record["body"] == "amount=1050&currency=USD&customer_id=c1"


@pytest.mark.parametrize(
    "header", ["X-HTTP-Method-Override", "X-Method-Override", "X_HTTP_Method_Override"]
)
async def test_a_method_override_header_is_refused(
    readers_canon_tenant: Tenant, gateway: Gateway, upstream: httpx.AsyncClient, header: str
) -> None:
    tenant = readers_canon_tenant
    seen = len(await readings(upstream, tenant.id))
    for method, target, body in (("POST", "/refunds", REFUND), ("GET", "/refunds/r1", b"")):
        headers = {**tenant.auth("buyer-01"), "Idempotency-Key": uuid.uuid4().hex, header: "PUT"}
        if body:
            headers["Content-Type"] = "application/json"
        status, _, content = await raw_request(
            gateway.url, method, f"/tools/payments{target}", headers, body
        )
        assert (status, json.loads(content)["reason"]) == (400, "method_override"), content
    assert len(await readings(upstream, tenant.id)) == seen


async def test_decision_api_reads_its_body_strictly(
    decision_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    """The decision API prices a JSON body too: keys that differ only in case are
    refused there as on the proxy (observation 5)."""
    tenant = decision_tenant
    body = b'{"tool":"deploy","method":"POST","path":"/deploys","body":{"env":"a","ENV":"b"}}'
    response = await http.post(
        "/v1/holds",
        content=body,
        headers={
            **tenant.auth("deployer-01"),
            "Idempotency-Key": uuid.uuid4().hex,
            "Content-Type": "application/json",
        },
    )
    assert_problem(response, 400, "bad_json")
