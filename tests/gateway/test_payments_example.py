"""examples/payments-api.yaml, end to end: a real `irrev serve` serving the example
(fresh tokens, its upstream pointed here) in front of irrev/upstreams/payments.py, a Stripe-like
API that requires the gateway's bearer key, takes form bodies only and reads
`amount` in cents. Issue 10's acceptance line "an example policy ... in front of an
authenticated API".
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from scipy.stats import beta

from gateway.state.credentials import resolve_credentials
from gateway.state.policies import load_demo_tokens, load_policy_dir
from irrev.stack import render_policies
from pricing.money import round_up

from .conftest import Gateway, wait_for_workers
from .helpers import assert_problem, balances
from .servers import BIN, EXAMPLES, Server, Tenant, base_env, write_policy

KEY_ENV = "PAYMENTS_API_KEY"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CHARGES = "/tools/payments/v1/charges"


@dataclass
class Payco:
    gateway: Gateway
    tenant: Tenant
    api: Server  # irrev/upstreams/payments.py
    secret: str  # the API key, in the gateway's environment only
    answers: list[httpx.Response] = field(default_factory=list)  # every gateway answer

    def api_client(self) -> httpx.Client:
        bearer = {"Authorization": f"Bearer {self.secret}"}
        return httpx.Client(base_url=self.api.url, headers=bearer, trust_env=False)

    def received(self) -> list[dict[str, Any]]:
        """What the payments API was sent, oldest first."""
        with self.api_client() as client:
            seen: list[dict[str, Any]] = client.get("/_received").json()
            return seen


@pytest.fixture(scope="module")
def payco(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Payco]:
    root = tmp_path_factory.mktemp("payco")
    secret = f"sk_test_{secrets.token_hex(16)}"
    api = Server(
        name="payments API",
        argv=[
            str(BIN / "python"),
            "-m",
            "uvicorn",
            "irrev.upstreams.payments:create_payments",
            "--factory",
        ],
        env=base_env(**{KEY_ENV: secret}),
        log_path=root / "payments.log",
    )
    api.argv += ["--host", "127.0.0.1", "--port", str(api.port), "--log-level", "warning"]
    api.start("/_health")
    policies = root / "policies"
    policies.mkdir()
    tenant = write_policy(policies, "payments-api", f"payco-{secrets.token_hex(4)}", api.url)
    admin_token = secrets.token_urlsafe(24)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(policies),
        IRREV_ADMIN_TOKENS=f"ops={admin_token}",
        **{KEY_ENV: secret},
    )
    server = Server(
        name="payco gateway",
        argv=[str(BIN / "irrev"), "serve"],
        env=env,
        log_path=root / "gateway.log",
    )
    server.argv += ["--port", str(server.port), "--workers", "1"]
    try:
        server.start("/readyz")
        gateway = Gateway(server, redis_url, admin_token, {"payco": tenant})
        wait_for_workers(gateway, workers=1)
        yield Payco(gateway, tenant, api, secret)
    finally:
        server.stop()
        api.stop()


@pytest.fixture
async def http(payco: Payco) -> AsyncIterator[httpx.AsyncClient]:
    async def keep(response: httpx.Response) -> None:
        await response.aread()
        payco.answers.append(response)

    async with httpx.AsyncClient(
        base_url=payco.gateway.url,
        timeout=30.0,
        trust_env=False,
        event_hooks={"response": [keep]},
    ) as client:
        yield client


def agent(payco: Payco, name: str, key: str | None = None) -> dict[str, str]:
    headers = payco.tenant.auth(name)
    return {**headers, **FORM, "Idempotency-Key": key} if key else headers


async def charge(
    http: httpx.AsyncClient, payco: Payco, key: str, body: str, **headers: str
) -> httpx.Response:
    return await http.post(
        CHARGES, content=body, headers={**agent(payco, "checkout-01", key), **headers}
    )


def quantile_price(face_micros: int) -> int:
    """The example's charge pricing, from its parameters: the 0.999 quantile of the
    residual, recovery r ~ Beta(97, 3), p_fail at the 0.95 bound of Beta(1, 199)."""
    r = float(beta.ppf(0.001, 97, 3))
    p_fail = float(beta.ppf(0.95, 1, 199))
    return round_up(face_micros, (1.0 - r) + r * p_fail)


def test_the_stack_commands_serve_without_the_payments_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`irrev demo` and `irrev load` serve what render_policies writes: a tenant whose
    credential is missing would refuse the whole directory."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    rendered = render_policies(tmp_path / "policies", "http://127.0.0.1:9", EXAMPLES)
    policies = load_policy_dir(rendered)
    assert "acme" in policies
    for policy in policies.values():
        resolve_credentials(policy)


async def test_a_charge_is_priced_from_cents_and_sent_with_the_gateways_key(
    payco: Payco, http: httpx.AsyncClient
) -> None:
    with payco.api_client() as api:
        assert (
            api.get("/v1/charges/ch_1", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
    before = len(payco.received())
    version = {"Stripe-Version": "2024-06-20"}
    answer = await charge(
        http, payco, "order-1001", "customer=cus_1&currency=usd&amount=1999", **version
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-irrev-decision"] == "admit"
    assert int(answer.headers["x-irrev-price"]) == quantile_price(19_990_000)  # 2.43 USD
    assert answer.headers["request-id"].startswith("req_")
    made = answer.json()
    assert (made["object"], made["amount"], made["customer"]) == ("charge", 1999, "cus_1")

    sent = payco.received()[before:]
    assert len(sent) == 1
    hold = answer.headers["x-irrev-hold"]
    headers = sent[0]["headers"]
    assert headers["authorization"] == f"Bearer {payco.secret}"
    assert headers["content-type"] == FORM["Content-Type"]
    assert headers["idempotency-key"] == f"irrev-{hold}"
    assert headers["stripe-version"] == "2024-06-20"
    assert sent[0]["body"] == "amount=1999&currency=usd&customer=cus_1"
    assert payco.tenant.tokens["checkout-01"] not in str(sent)

    rows = await balances(http, payco.gateway.admin, payco.tenant)
    retry = await charge(
        http, payco, "order-1001", "customer=cus_1&currency=usd&amount=1999", **version
    )
    assert retry.status_code == 200, retry.text
    assert retry.headers["x-irrev-hold"] == hold and retry.json()["id"] == made["id"]
    assert len(payco.received()) == before + 1
    assert await balances(http, payco.gateway.admin, payco.tenant) == rows

    read = await http.get(f"{CHARGES}/{made['id']}", headers=agent(payco, "checkout-01"))
    assert read.status_code == 200, read.text
    assert read.json()["id"] == made["id"]
    assert payco.received()[-1]["headers"]["authorization"] == f"Bearer {payco.secret}"


async def test_a_charge_in_another_currency_is_refused_unsent(
    payco: Payco, http: httpx.AsyncClient
) -> None:
    before = len(payco.received())
    answer = await charge(http, payco, "order-eur", "amount=1999&currency=eur&customer=cus_1")
    assert_problem(answer, 422, "currency_mismatch")
    assert len(payco.received()) == before


async def test_an_agent_is_refused_a_route_outside_its_allow_lists(
    payco: Payco, http: httpx.AsyncClient
) -> None:
    before = len(payco.received())
    refund = await http.post(
        "/tools/payments/v1/refunds",
        content="amount=100&charge=ch_1",
        headers=agent(payco, "checkout-01", "refund-1"),
    )
    assert_problem(refund, 403, "route_not_allowed")
    # support-01 lists no transfers itself, and its principal (billing) forbids them.
    payout = await http.post(
        "/tools/payments/v1/transfers",
        content="amount=100&currency=usd&destination=acct_1",
        headers=agent(payco, "support-01", "payout-1"),
    )
    assert_problem(payout, 403, "route_not_allowed")
    assert len(payco.received()) == before


async def test_the_settler_trues_up_a_charge(payco: Payco, http: httpx.AsyncClient) -> None:
    """The payments API's settlement job reports what the charge really cost (the
    processing fee a refund did not return); the rest of the price goes back."""
    answer = await charge(http, payco, "order-1002", "amount=5000&currency=usd&customer=cus_2")
    assert answer.status_code == 200, answer.text
    hold, price = answer.headers["x-irrev-hold"], int(answer.headers["x-irrev-price"])
    settle = f"/v1/holds/{hold}/settle"
    fee = 1_750_000  # 2.9% + 30 cents of 50 USD
    assert fee < price

    async def posted() -> int:
        rows = await balances(http, payco.gateway.admin, payco.tenant)
        return int(rows["agent:checkout-01"]["posted"])

    before = await posted()
    by_agent = await http.post(
        settle, json={"realised_micros": 0}, headers=agent(payco, "checkout-01")
    )
    assert_problem(by_agent, 403, "settlement_forbidden")
    settled = await http.post(
        settle, json={"realised_micros": fee}, headers=payco.tenant.settler("payments")
    )
    assert settled.status_code == 200, settled.text
    assert settled.json()["state"] == "posted"
    assert await posted() == before - price + fee


async def test_a_large_refund_waits_for_the_tenants_approver(
    payco: Payco, http: httpx.AsyncClient
) -> None:
    """Refunds above 500 USD escalate; the example's `ops-lead` (role approver, its
    token from the demo token file) approves, and only then is the refund made."""
    ops_lead = load_demo_tokens(EXAMPLES / "payments-api.tokens.yaml").admins["ops-lead"]
    before = len(payco.received())
    refund = await http.post(
        "/tools/payments/v1/refunds",
        content="amount=60000&charge=ch_1",
        headers=agent(payco, "support-01", "refund-600"),
    )
    assert refund.status_code == 202, refund.text
    assert len(payco.received()) == before
    approved = await http.post(
        f"{refund.headers['location']}/approve", headers={"Authorization": f"Bearer {ops_lead}"}
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["object"] == "refund"
    sent = payco.received()[before:]
    assert [(r["path"], r["body"]) for r in sent] == [("/v1/refunds", "amount=60000&charge=ch_1")]


async def test_the_secret_is_in_no_answer(payco: Payco, http: httpx.AsyncClient) -> None:
    """Whatever the agent does (an effect, its retry, a refusal, a read, a bad token),
    no answer carries the API key; nor does the gateway's log."""
    key = "order-secret"
    for body in (
        "amount=250&currency=usd&customer=cus_3",
        "amount=250&currency=gbp&customer=cus_3",
    ):
        await charge(http, payco, key, body)
    await http.get(f"{CHARGES}/ch_404", headers=agent(payco, "checkout-01"))
    await http.post(CHARGES, content="amount=1", headers={**FORM, "Authorization": "Bearer x"})
    assert len(payco.answers) >= 4
    for answer in payco.answers:
        assert payco.secret not in answer.text
        assert payco.secret not in str(answer.headers.multi_items())
    assert payco.secret not in payco.gateway.server.log()
