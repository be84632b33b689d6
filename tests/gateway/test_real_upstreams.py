"""irrev in front of an authenticated tool API: the gateway adds the tool's credentials
(from an environment variable and a secret file) to every request it sends, passes
only the agent headers the tool allows, returns only the answer headers it allows,
and keeps every secret out of logs, the journal, holds, metrics and answers. Plus
scoping: route allow-lists per agent and principal, and per-tenant admins with roles.

One `irrev serve --workers 2` of its own serves two tenants: `paying` (its supplier
requires a bearer token) and `other`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.edge.wire import StoredRequest
from gateway.routes.admin_ledger import forwarded
from irrev.harness import new_token
from ledger.cluster import redis_client
from ledger.keys import tenant_prefix
from pricing.credentials import hash_token

from .conftest import UPSTREAM_TIMEOUT_S, Gateway, wait_for_workers
from .helpers import assert_problem, balances, based, effect_headers, order, used
from .servers import BIN, Server, Tenant, base_env, write_policy

TOKEN_ENV = "SUPPLIER_API_TOKEN"
ROLES = ("viewer", "approver", "policy_admin")
TRACE_1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_2 = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


@dataclass
class Trusted:
    gateway: Gateway
    paying: Tenant
    other: Tenant
    supplier: str  # the paying tenant's supplier name on the suppliers server
    bearer: str  # the secret in the environment variable
    api_key: str  # the secret in the file
    secret_file: Path
    admins: dict[str, str]  # role -> token of a `paying` admin with that role
    other_admin: str  # a policy_admin of `other`
    policy_dir: Path

    def admin(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admins[role]}"}


def _edit(path: Path, change: Any) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def trusted(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Trusted]:
    root = tmp_path_factory.mktemp("trusted")
    policies = root / "policies"
    policies.mkdir()
    run = secrets.token_hex(4)
    bearer, api_key = f"sk_live_{secrets.token_hex(16)}", f"key_{secrets.token_hex(16)}"
    secret_file = root / "supplier-api-key"
    secret_file.write_text(api_key + "\n")
    name = f"bearer-{run}"
    paying = write_policy(policies, "procurement", f"paying-{run}", f"{suppliers.url}/{name}")
    other = write_policy(policies, "procurement", f"other-{run}", f"{suppliers.url}/other-{run}")
    admins = {role: new_token() for role in ROLES}
    other_admin = new_token()

    def paying_policy(data: dict[str, Any]) -> None:
        data["tools"]["supplier"].update(
            credentials={
                "Authorization": {"env": TOKEN_ENV, "prefix": "Bearer "},
                "X-Api-Key": {"file": str(secret_file)},
            },
            forward_headers=["Stripe-Version"],
            response_headers=["X-Supplier-Trace"],
        )
        data["agents"]["buyer-02"]["routes"] = ["supplier GET /catalog", "supplier POST /orders"]
        data["agents"]["deployer-01"]["routes"] = ["supplier GET /catalog"]
        data["accounts"]["principals"]["finance"]["routes"] = ["payments *"]
        data["admins"] = {
            f"{role}-1": {"token_sha256": hash_token(token), "role": role}
            for role, token in admins.items()
        }

    def other_policy(data: dict[str, Any]) -> None:
        data["admins"] = {"boss": {"token_sha256": hash_token(other_admin), "role": "policy_admin"}}

    _edit(policies / f"{paying.id}.yaml", paying_policy)
    _edit(policies / f"{other.id}.yaml", other_policy)
    admin_token = secrets.token_urlsafe(24)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policies),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        # The shared gateway's wait: most forwards here are honest, and a loaded
        # machine can take longer than 1 s to answer one.
        IRREV_UPSTREAM_TIMEOUT_S=str(UPSTREAM_TIMEOUT_S),
        IRREV_FORWARD_MARGIN_S="0.5",
        IRREV_SWEEP_INTERVAL_S="0.5",
        **{TOKEN_ENV: bearer},
    )
    with httpx.Client(base_url=suppliers.url, trust_env=False) as client:
        required = {"header": "authorization", "value": f"Bearer {bearer}"}
        client.post(f"/_require/{name}", json=required).raise_for_status()
    server = Server(
        name="trusted gateway",
        argv=[str(BIN / "irrev"), "serve"],
        env=env,
        log_path=root / "gateway.log",
    )
    server.argv += ["--port", str(server.port), "--workers", "2"]
    server.start("/readyz")
    try:
        gateway = Gateway(server, redis_url, admin_token, {"paying": paying, "other": other})
        wait_for_workers(gateway)
        yield Trusted(
            gateway,
            paying,
            other,
            supplier=name,
            bearer=bearer,
            api_key=api_key,
            secret_file=secret_file,
            admins=admins,
            other_admin=other_admin,
            policy_dir=policies,
        )
    finally:
        server.stop()


@pytest.fixture
async def client(trusted: Trusted) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=trusted.gateway.url, timeout=30.0, trust_env=False
    ) as http:
        yield http


async def faults(upstream: httpx.AsyncClient, trusted: Trusted, **faults: Any) -> None:
    response = await upstream.post(f"/{trusted.supplier}/_faults", json=faults)
    assert response.status_code == 200, response.text


async def received(upstream: httpx.AsyncClient, supplier: str) -> list[dict[str, str]]:
    """The headers of every request the supplier received, oldest first."""
    response = await upstream.get(f"/_headers/{supplier}")
    return [dict(headers) for headers in response.json()]


# -- credentials and headers -------------------------------------------------------


async def test_an_approver_sees_the_request_line_and_the_headers_an_approval_sends(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """An approval forwards the stored path, query and passed headers; the queue and the
    hold showed only the route's template and the body, so a destination in the path
    or query, or an API version in a header, went out unseen by the person approving."""
    tenant = trusted.paying
    headers = {
        **effect_headers(tenant, "buyer-01", "approve-what-is-sent"),
        "Stripe-Version": "2019-legacy",
    }
    response = await client.post(
        "/tools/supplier/orders", json=order(quantity=450), headers=headers
    )
    assert response.status_code == 202, response.text
    hold = response.headers["x-irrev-hold"]
    queue = await client.get(
        f"/v1/admin/tenants/{tenant.id}/escalations", headers=trusted.admin("approver")
    )
    assert queue.status_code == 200, queue.text
    [item] = [e for e in queue.json()["escalations"] if e["hold"] == hold]
    viewed = await client.get(
        f"/v1/admin/tenants/{tenant.id}/holds/{hold}", headers=trusted.admin("approver")
    )
    assert viewed.status_code == 200, viewed.text
    for view in (item, viewed.json()):
        assert view["target"] == "POST /orders"
        assert view["headers"] == ["stripe-version: 2019-legacy"]


def test_the_request_line_shown_carries_the_query_as_forwarded() -> None:
    stored = StoredRequest(
        agent="a",
        tool="payments",
        method="POST",
        path="/accounts/CORP-TREASURY/transfers",
        query="to=ATTACKER-ACCT-666",
        content_type="application/json",
        body_b64="",
        route_id="payments POST /accounts/{account_id}/transfers",
        price=1,
        headers=(("x-api-version", "2019-legacy-unsafe"),),
    )
    assert forwarded(stored) == {
        "target": "POST /accounts/CORP-TREASURY/transfers?to=ATTACKER-ACCT-666",
        "headers": ["x-api-version: 2019-legacy-unsafe"],
    }


async def test_credentials_are_added_and_only_allowed_agent_headers_pass(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = trusted.paying
    agent_headers = {
        **effect_headers(tenant, "buyer-01", "creds-1"),
        "Cookie": "agent-session=1",
        "X-Custom": "not-allowed",
        "Stripe-Version": "2024-06-20",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "Accept": "text/csv",
    }
    response = await client.post("/tools/supplier/orders", json=order(), headers=agent_headers)
    assert response.status_code == 201, response.text
    # The tool allows its trace header back; cookies and credentials never come back.
    assert response.headers["x-supplier-trace"] == f"{trusted.supplier}-trace"
    seen = (await received(upstream, trusted.supplier))[-1]
    assert seen["authorization"] == f"Bearer {trusted.bearer}"
    assert seen["x-api-key"] == trusted.api_key
    assert seen["stripe-version"] == "2024-06-20"
    assert seen["traceparent"] == agent_headers["traceparent"]
    assert seen["accept"] == "*/*"  # the gateway's own, not the agent's (test_outcomes)
    for name in ("cookie", "x-custom"):
        assert name not in seen, seen
    assert tenant.tokens["buyer-01"] not in str(seen)

    read = await client.get("/tools/supplier/catalog", headers=tenant.auth("buyer-01"))
    assert read.status_code == 200, read.text
    assert (await received(upstream, trusted.supplier))[-1]["authorization"] == seen[
        "authorization"
    ]


async def test_a_header_the_forward_could_not_send_is_refused_before_anything_is_held(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """A passed header's value past ASCII (here Stripe-Version: 0xff, which the server
    reads as latin-1) made the forward fail after the hold was charged: a 500 saying
    nothing was admitted, the hold pending, then ambiguous, and every repeat of the key
    sent the same stored header and failed the same way. (A trace context that is not
    printable ASCII is no valid one, and is dropped instead: test_tracing.py.)"""
    tenant = trusted.paying
    before = used(await balances(client, trusted.gateway.admin, tenant))
    sent = len(await received(upstream, trusted.supplier))
    headers = [
        *((k.encode(), v.encode()) for k, v in effect_headers(tenant, "buyer-01", "xff").items()),
        (b"stripe-version", b"\xff"),
    ]
    response = await client.post("/tools/supplier/orders", json=order(), headers=headers)
    assert_problem(response, 400, "bad_header")
    assert used(await balances(client, trusted.gateway.admin, tenant)) == before
    assert len(await received(upstream, trusted.supplier)) == sent


async def test_a_retry_sends_the_same_passed_headers_and_other_ones_are_another_effect(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = trusted.paying
    await faults(upstream, trusted, status=503, apply=True, times=1)
    headers = {
        **effect_headers(tenant, "buyer-01", "creds-retry"),
        "Stripe-Version": "v1",
        "traceparent": TRACE_1,
    }
    first = await client.post("/tools/supplier/orders", json=order(), headers=headers)
    assert_problem(first, 502, "upstream_ambiguous")
    # A different API version is a different request: not a retry of this key.
    other = await client.post(
        "/tools/supplier/orders", json=order(), headers={**headers, "Stripe-Version": "v2"}
    )
    assert_problem(other, 409, "idempotency_conflict")
    # A new trace context on the retry is the same effect; the first one is resent.
    retry = await client.post(
        "/tools/supplier/orders", json=order(), headers={**headers, "traceparent": TRACE_2}
    )
    assert retry.status_code == 201, retry.text
    sent = [h for h in await received(upstream, trusted.supplier) if h.get("x-irrev-hold")]
    hold = first.headers["x-irrev-hold"]
    forwarded = [h for h in sent if h["x-irrev-hold"] == hold]
    assert [h["stripe-version"] for h in forwarded] == ["v1", "v1"]
    assert [h["traceparent"] for h in forwarded] == [TRACE_1, TRACE_1]


async def test_reconcile_looks_up_with_the_credentials(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = trusted.paying
    await faults(upstream, trusted, delay_s=UPSTREAM_TIMEOUT_S + 1.5, times=1)
    response = await client.post(
        "/tools/supplier/orders",
        json=order(),
        headers=effect_headers(tenant, "buyer-01", "creds-slow"),
    )
    assert_problem(response, 504, "upstream_ambiguous")
    hold = response.headers["x-irrev-hold"]
    report = await client.post(
        f"/v1/admin/tenants/{tenant.id}/reconcile", headers=trusted.gateway.admin
    )
    assert report.status_code == 200, report.text
    assert hold in report.json()["posted"], report.json()
    lookup = (await received(upstream, trusted.supplier))[-1]
    assert lookup["authorization"] == f"Bearer {trusted.bearer}"


def _upload_text(trusted: Trusted, change: Any) -> str:
    data = yaml.safe_load((trusted.policy_dir / f"{trusted.paying.id}.yaml").read_text())
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("credentials", {"Authorization": {"env": "NO_SUCH_VARIABLE_X1"}}, "NO_SUCH_VARIABLE_X1"),
        ("credentials", {"X-Api-Key": {"file": "/nonexistent/irrev-secret"}}, "irrev-secret"),
        ("credentials", {"Authorization": {"env": "IRREV_ADMIN_TOKENS"}}, "IRREV_"),
        ("credentials", {"Host": {"env": TOKEN_ENV}}, "Host"),
        ("forward_headers", ["Authorization"], "Authorization"),
        ("forward_headers", ["Cookie"], "Cookie"),
        ("forward_headers", ["X-HTTP-Method-Override"], "X-HTTP-Method-Override"),
        ("forward_headers", ["Transfer-Encoding"], "Transfer-Encoding"),
        ("forward_headers", ["X-Api-Key"], "credential"),
        # CGI-style servers (Rack, PHP-FPM, WSGI) read '_' in a header name as '-'.
        ("forward_headers", ["X_HTTP_Method_Override"], "X_HTTP_Method_Override"),
        ("forward_headers", ["Idempotency_Key"], "Idempotency_Key"),
        ("forward_headers", ["X_Api_Key"], "credential"),
        ("response_headers", ["Set-Cookie"], "Set-Cookie"),
        ("response_headers", ["Authorization"], "Authorization"),
        ("response_headers", ["X-Api-Key"], "credential"),
    ],
)
async def test_unsafe_or_missing_credentials_and_headers_are_refused(
    trusted: Trusted, client: httpx.AsyncClient, field: str, value: Any, named: str
) -> None:
    def change(data: dict[str, Any]) -> None:
        if field == "credentials":
            data["tools"]["supplier"]["credentials"] = value
        else:
            data["tools"]["supplier"][field] = value

    before = (trusted.policy_dir / f"{trusted.paying.id}.yaml").read_text()
    response = await client.put(
        f"/v1/admin/tenants/{trusted.paying.id}/policy",
        content=_upload_text(trusted, change),
        headers=await based(client, trusted.paying.id, trusted.gateway.admin),
    )
    body = assert_problem(response, 422, "invalid_policy")
    assert named in response.text, body
    assert trusted.bearer not in response.text and trusted.api_key not in response.text
    assert (trusted.policy_dir / f"{trusted.paying.id}.yaml").read_text() == before


async def test_a_rotated_secret_file_reaches_every_worker(
    trusted: Trusted, upstream: httpx.AsyncClient
) -> None:
    rotated = f"key_{secrets.token_hex(16)}"
    trusted.secret_file.write_text(rotated + "\n")
    loop = asyncio.get_running_loop()
    deadline, in_a_row = loop.time() + 30, 0
    # A fresh connection per read, so that the kernel spreads them over the workers.
    while in_a_row < 8:
        assert loop.time() < deadline, "the rotated secret never reached every worker"
        async with httpx.AsyncClient(base_url=trusted.gateway.url, trust_env=False) as fresh:
            read = await fresh.get(
                "/tools/supplier/catalog", headers=trusted.paying.auth("buyer-01")
            )
        assert read.status_code == 200, read.text
        sent = (await received(upstream, trusted.supplier))[-1]["x-api-key"]
        in_a_row = in_a_row + 1 if sent == rotated else 0
        await asyncio.sleep(0.05)
    trusted.api_key = rotated


# -- scoping ---------------------------------------------------------------------


async def test_route_allow_lists_refuse_before_anything_is_held_or_sent(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant, admin = trusted.paying, trusted.gateway.admin
    allowed = await client.post(
        "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-02", "s1")
    )
    assert allowed.status_code == 201, allowed.text
    before = used(await balances(client, admin, tenant))
    requests = len(await received(upstream, trusted.supplier))
    refused = [
        # buyer-02 may order but not cancel.
        await client.post(
            "/tools/supplier/orders/o-1/cancel",
            json={"supplier_id": "s1", "cancellation_fee": "10"},
            headers=effect_headers(tenant, "buyer-02", "s2"),
        ),
        # finance's agents may use payments only, reads included.
        await client.get("/tools/supplier/catalog", headers=tenant.auth("refunds-01")),
        await client.post(
            "/tools/supplier/orders",
            json=order(),
            headers=effect_headers(tenant, "refunds-01", "s3"),
        ),
        # The decision API too.
        await client.post(
            "/v1/holds",
            json={"tool": "deploy", "method": "POST", "path": "/deploys"},
            headers=effect_headers(tenant, "deployer-01", "s4"),
        ),
    ]
    for response in refused:
        body = assert_problem(response, 403, "route_not_allowed")
        assert "allow-list" in body["detail"]
    assert used(await balances(client, admin, tenant)) == before
    assert len(await received(upstream, trusted.supplier)) == requests
    payments = await client.post(
        "/tools/payments/refunds",
        json={"customer_id": "c1", "amount": "1"},
        headers=effect_headers(tenant, "refunds-01", "s5"),
    )
    assert payments.status_code != 403, payments.text


async def test_a_scope_naming_no_route_is_refused(
    trusted: Trusted, client: httpx.AsyncClient
) -> None:
    for scope in ("supplier POST /nowhere", "nosuchtool *", "supplier"):
        text = _upload_text(
            trusted, lambda data, s=scope: data["agents"]["buyer-05"].update(routes=[s])
        )
        response = await client.put(
            f"/v1/admin/tenants/{trusted.paying.id}/policy",
            content=text,
            headers=await based(client, trusted.paying.id, trusted.gateway.admin),
        )
        body = assert_problem(response, 422, "invalid_policy")
        assert any("agents.buyer-05.routes[0]" in p for p in body["problems"]), body


# -- tenant admins ---------------------------------------------------------------


async def escalate(client: httpx.AsyncClient, tenant: Tenant, agent: str) -> str:
    """An order above the route's approval threshold: one per agent and supplier (their
    caps)."""
    response = await client.post(
        "/tools/supplier/orders",
        json=order(quantity=450, supplier_id=f"s-{agent}"),
        headers=effect_headers(tenant, agent, f"escalated-{agent}"),
    )
    assert response.status_code == 202, response.text
    location: str = response.headers["location"]
    return location


async def test_a_viewer_reads_its_tenant_only(trusted: Trusted, client: httpx.AsyncClient) -> None:
    paying, other = trusted.paying.id, trusted.other.id
    viewer = trusted.admin("viewer")
    for path in ("policy", "balances", "journal", "escalations", "holds?state=pending"):
        mine = await client.get(f"/v1/admin/tenants/{paying}/{path}", headers=viewer)
        assert mine.status_code == 200, (path, mine.text)
        theirs = await client.get(f"/v1/admin/tenants/{other}/{path}", headers=viewer)
        assert_problem(theirs, 404, "unknown_tenant")
    listed = await client.get("/v1/admin/tenants", headers=viewer)
    assert [row["tenant"] for row in listed.json()] == [paying]
    location = await escalate(client, trusted.paying, "buyer-04")
    for method, path in [
        ("POST", f"/v1/admin/tenants/{paying}/reconcile"),
        ("POST", f"{location}/approve"),
        ("POST", f"{location}/reject"),
        ("PUT", f"/v1/admin/tenants/{paying}/policy"),
        ("POST", "/v1/admin/policies/reload"),
    ]:
        response = await client.request(method, path, headers=viewer, content=b"tenant: x")
        assert_problem(response, 403, "insufficient_role")


async def test_an_approver_decides_escalations_of_its_tenant_by_name(
    trusted: Trusted, client: httpx.AsyncClient
) -> None:
    approver = trusted.admin("approver")
    location = await escalate(client, trusted.paying, "buyer-05")
    foreign = {"Authorization": f"Bearer {trusted.other_admin}"}
    assert_problem(await client.post(f"{location}/approve", headers=foreign), 404, "not_found")
    approved = await client.post(f"{location}/approve", headers=approver)
    assert approved.status_code == 201, approved.text
    again = await client.post(f"{location}/approve", headers=trusted.gateway.admin)
    body = assert_problem(again, 409, "escalation_resolved")
    assert body["by"] == "approver-1"
    rejected_location = await escalate(client, trusted.paying, "buyer-06")
    rejected = await client.post(f"{rejected_location}/reject", headers=approver)
    assert rejected.json()["by"] == "approver-1"
    report = await client.post(f"/v1/admin/tenants/{trusted.paying.id}/reconcile", headers=approver)
    assert report.status_code == 200, report.text
    upload = await client.put(
        f"/v1/admin/tenants/{trusted.paying.id}/policy", headers=approver, content=b"x"
    )
    assert_problem(upload, 403, "insufficient_role")


async def test_a_policy_admin_changes_its_policy_but_not_where_secrets_go(
    trusted: Trusted, client: httpx.AsyncClient
) -> None:
    """Where a tool's requests go, the secrets they carry and who settles its holds are
    the operator's (issue 26: a policy_admin replaced a tool's settler credential with
    one of its own, which settles, voids and trues up the tool's holds)."""
    policy_admin, paying = trusted.admin("policy_admin"), trusted.paying.id
    own_settler = new_token()

    def raise_limit(data: dict[str, Any]) -> None:
        data["accounts"]["principals"]["platform"]["limit"] = "12000"

    url = f"/v1/admin/tenants/{paying}/policy"
    applied = await client.put(
        url,
        content=_upload_text(trusted, raise_limit),
        headers=await based(client, paying, policy_admin),
    )
    assert applied.json()["status"] == "applied", applied.text
    before = (trusted.policy_dir / f"{paying}.yaml").read_text()
    for change, fields in (
        (
            lambda data: data["tools"]["supplier"].update(
                settler_token_sha256=hash_token(own_settler)
            ),
            ["tools.supplier.settler_token_sha256"],
        ),
        (
            lambda data: data["tools"]["supplier"].pop("settler_token_sha256"),
            ["tools.supplier.settler_token_sha256"],
        ),
        (
            lambda data: data["tools"]["supplier"].update(upstream="http://127.0.0.1:9"),
            ["tools.supplier.upstream"],
        ),
        (
            lambda data: data["tools"]["supplier"]["credentials"]["Authorization"].update(
                env="HOME"
            ),
            ["tools.supplier.credentials"],
        ),
        # Events, and a signature under any secret the gateway can read, would go there.
        (
            lambda data: data.update(
                webhook={"url": "http://127.0.0.1:9/hooks", "secret": {"env": "HOME"}}
            ),
            ["webhook"],
        ),
    ):
        refused = await client.put(
            url,
            content=_upload_text(trusted, change),
            headers=await based(client, paying, policy_admin),
        )
        body = assert_problem(refused, 403, "operator_only")
        assert body["fields"] == fields, body
        assert (trusted.policy_dir / f"{paying}.yaml").read_text() == before
    # Nothing was applied: the admin's own credential settles nothing.
    void = await client.post(
        "/v1/holds/h-any/void", headers={"Authorization": f"Bearer {own_settler}"}
    )
    assert_problem(void, 401, "unauthenticated")
    foreign = await client.put(
        f"/v1/admin/tenants/{trusted.other.id}/policy", content=before, headers=policy_admin
    )
    assert_problem(foreign, 404, "unknown_tenant")
    reload = await client.post("/v1/admin/policies/reload", headers=policy_admin)
    assert reload.json() == {"tenants": [paying]}, reload.text
    operator = await client.post("/v1/admin/policies/reload", headers=trusted.gateway.admin)
    assert {paying, trusted.other.id} <= set(operator.json()["tenants"])


async def test_a_tenant_admin_learns_nothing_of_another_tenants_broken_policy(
    trusted: Trusted, client: httpx.AsyncClient
) -> None:
    """Contract 10: another tenant's file names, faults and secret names are its own;
    a tenant's policy admin hears nothing of them, and its own reload and upload are
    applied regardless (one tenant's broken file holds back no other tenant)."""
    other_file = trusted.policy_dir / f"{trusted.other.id}.yaml"
    before = other_file.read_text()
    variable = f"OTHER_LIVE_KEY_{secrets.token_hex(4).upper()}"

    def missing_secret(data: dict[str, Any]) -> None:
        data["tools"]["supplier"]["credentials"] = {"X-Key": {"env": variable}}

    _edit(other_file, missing_secret)
    try:
        reload = await client.post(
            "/v1/admin/policies/reload", headers=trusted.admin("policy_admin")
        )
        upload = await client.put(
            f"/v1/admin/tenants/{trusted.paying.id}/policy",
            content=(trusted.policy_dir / f"{trusted.paying.id}.yaml").read_text(),
            headers=await based(client, trusted.paying.id, trusted.admin("policy_admin")),
        )
        assert reload.json() == {"tenants": [trusted.paying.id]}, reload.text
        assert upload.json()["status"] == "applied", upload.text
        for response in (reload, upload):
            assert variable not in response.text and trusted.other.id not in response.text
        operator = await client.post("/v1/admin/policies/reload", headers=trusted.gateway.admin)
        assert_problem(operator, 422, "invalid_policy")
        assert variable in operator.text
    finally:
        other_file.write_text(before)


# -- no secret anywhere ------------------------------------------------------------


async def tenant_store_text(redis_url: str, tenant: str) -> str:
    """Everything Redis holds for a tenant (holds, journal, accounts), as text."""
    redis = redis_client(redis_url)
    parts = []
    try:
        async for key in redis.scan_iter(match=tenant_prefix(tenant) + "*", count=500):
            kind = await redis.type(key)
            assert isinstance(kind, bytes)  # a client without decode_responses
            kind = kind.decode()
            if kind == "hash":
                parts.append(str(await redis.hgetall(key)))
            elif kind == "stream":
                parts.append(str(await redis.xrange(key)))
            elif kind == "string":
                parts.append(str(await redis.get(key)))
            else:
                parts.append(str(await redis.dump(key)))
    finally:
        await redis.aclose()
    return "\n".join(parts)


async def test_no_secret_reaches_logs_store_metrics_or_answers(
    trusted: Trusted, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    tenant = trusted.paying
    answers = [
        await client.post(
            "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-03", k)
        )
        for k in ("leak-1", "leak-1")
    ]
    answers.append(await client.get("/tools/supplier/catalog", headers=tenant.auth("buyer-03")))
    answers.append(
        await client.get(f"/v1/admin/tenants/{tenant.id}/policy", headers=trusted.admin("viewer"))
    )
    answers.append(
        await client.get(f"/v1/admin/tenants/{tenant.id}/journal", headers=trusted.gateway.admin)
    )
    answers.append(await client.get("/metrics"))
    store = await tenant_store_text(trusted.gateway.redis_url, tenant.id)
    log = trusted.gateway.log_text()
    for secret in (trusted.bearer, trusted.api_key):
        for response in answers:
            assert secret not in response.text and secret not in str(response.headers.raw)
        assert secret not in store
        assert secret not in log
    assert tenant.tokens["buyer-03"] not in log + store
