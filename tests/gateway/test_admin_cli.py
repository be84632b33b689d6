"""`irrev escalations list|approve|reject` and `irrev holds show|resolve` against the
shared gateway's admin API, as a tenant's own admins run them (the token from the
environment). The command runs in this process (`irrev.cli.main`, its output
captured): the gateway, its workers, Redis and the supplier are the real processes of
the other gateway tests, and each command costs no interpreter start."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from irrev.cli import main
from irrev.harness import new_token
from pricing.credentials import hash_token

from .conftest import Gateway, TenantMaker
from .helpers import DEPLOY, assert_problem, effect_headers, order, orders_made, set_faults
from .procurement import example_routes
from .servers import Tenant

# Tenant admins of `cli-loop` who drive `irrev escalations` and `irrev holds`: one may
# decide, one may only look.
CLI_APPROVER = new_token()
CLI_VIEWER = new_token()


@pytest.fixture(scope="module")
def cli_loop_tenant(new_tenant: TenantMaker) -> Tenant:
    """procurement, whose in-process deploys escalate (a decision-only approval), with
    an approver and a viewer of its own."""
    routes = [
        {**route, "approval_threshold": "500"} if route["tool"] == "deploy" else route
        for route in example_routes()
    ]
    admins = {
        "cleo": {"token_sha256": hash_token(CLI_APPROVER), "role": "approver"},
        "vic": {"token_sha256": hash_token(CLI_VIEWER), "role": "viewer"},
    }
    return new_tenant("cli-loop", routes=routes, admins=admins)


# A tenant the admins of cli-loop cannot reach.
@pytest.fixture(scope="module")
def cli_other_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("cli-other")


BIG = 450  # 450 x 100 USD: priced above the orders route's 30,000 USD approval threshold


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def said(self) -> str:
        """The one line a refusal or a usage error ends on."""
        return self.err.strip().splitlines()[-1]


Irrev = Callable[..., Ran]


@pytest.fixture
def irrev(
    gateway: Gateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Irrev]:
    """`irrev ARGV` with IRREV_GATEWAY_URL the shared gateway and IRREV_ADMIN_TOKEN
    `token` (cli-loop's approver by default)."""
    monkeypatch.setenv("IRREV_GATEWAY_URL", gateway.url)

    def run(*argv: str, token: str = CLI_APPROVER) -> Ran:
        monkeypatch.setenv("IRREV_ADMIN_TOKEN", token)
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    yield run


async def escalate(http: httpx.AsyncClient, tenant: Tenant, agent: str, key: str) -> str:
    """An order big enough to wait for a person; its escalation's id. Each from its own
    supplier, so that no supplier account binds."""
    body = order(quantity=BIG, supplier_id=f"s-{key}")
    response = await http.post(
        "/tools/supplier/orders", json=body, headers=effect_headers(tenant, agent, key)
    )
    assert response.status_code == 202, response.text
    return str(response.json()["escalation"])


async def hold_state(
    http: httpx.AsyncClient, gateway: Gateway, tenant: Tenant, hold: str
) -> dict[str, Any]:
    response = await http.get(f"/v1/admin/tenants/{tenant.id}/holds/{hold}", headers=gateway.admin)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


async def test_an_approval_forwards_once_and_a_rejection_reaches_the_agent(
    cli_loop_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    irrev: Irrev,
) -> None:
    tenant = cli_loop_tenant
    approved = await escalate(http, tenant, "buyer-01", "cli-approve")
    rejected = await escalate(http, tenant, "buyer-02", "cli-reject")

    listed = irrev("escalations", "list", "--tenant", tenant.id, "--json")
    assert listed.code == 0, listed.err
    page = json.loads(listed.out)
    waiting = {item["escalation"]: item for item in page["escalations"]}
    assert {approved, rejected} <= set(waiting)
    assert waiting[approved]["agent"] == "buyer-01"
    table = irrev("escalations", "list", "--tenant", tenant.id)
    assert approved in table.out and "supplier POST /orders" in table.out

    done = irrev("escalations", "approve", approved, "--reason", "restock agreed")
    assert done.code == 0, done.err
    assert done.out.strip() == f"approved {approved}: the tool answered 201"
    hold = approved.rpartition(".")[2]
    view = await hold_state(http, gateway, tenant, hold)
    assert (view["state"], view["by"], view["note"]) == ("posted", "cleo", "restock agreed")
    assert await orders_made(upstream, tenant) == 1
    # Exactly one approval wins: a second is refused, naming who decided.
    again = irrev("escalations", "approve", approved)
    assert again.code == 1 and again.out == ""
    assert again.said.startswith("irrev: escalation_resolved: already posted")
    assert again.said.endswith("(by cleo)")
    assert await orders_made(upstream, tenant) == 1

    # A reason the gateway refuses (it would forge a line in logs) decides nothing.
    forged = irrev("escalations", "reject", rejected, "--reason", "two\nlines")
    assert forged.code == 1 and forged.said.startswith("irrev: bad_request: ")
    assert "body.reason: " in forged.said
    why = "not this quarter"
    no = irrev("escalations", "reject", rejected, "--note", why, "--json")
    assert no.code == 0, no.err
    assert json.loads(no.out) == {
        "status": "rejected",
        "escalation": rejected,
        "by": "cleo",
        "note": why,
    }
    poll = await http.get(f"/v1/escalations/{rejected}", headers=tenant.auth("buyer-02"))
    assert assert_problem(poll, 403, "escalation_rejected")["note"] == why
    assert await orders_made(upstream, tenant) == 1


async def test_an_approval_whose_effect_was_not_made_says_so_and_exits_1(
    cli_loop_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    irrev: Irrev,
) -> None:
    """The approval stands; the exit code says the effect was not made, and the hold is
    as the forward left it: the tool refused it (voided), or its outcome is unknown."""
    tenant = cli_loop_tenant
    refused = await escalate(http, tenant, "buyer-05", "cli-tool-422")
    unknown = await escalate(http, tenant, "buyer-06", "cli-tool-503")
    await set_faults(upstream, tenant, status=422)
    try:
        as_json = irrev("escalations", "approve", refused, "--json")
        await set_faults(upstream, tenant, status=503)
        as_line = irrev("escalations", "approve", unknown)
    finally:
        await set_faults(upstream, tenant)
    assert as_json.code == 1 and as_json.err == ""
    approval = json.loads(as_json.out)
    assert (approval["effect"], approval["tool_status"]) == ("refused_by_tool", 422)
    assert (await hold_state(http, gateway, tenant, approval["hold"]))["state"] == "voided"
    assert as_line.code == 1 and as_line.err == ""
    assert as_line.out.startswith(f"approved {unknown}, but upstream_ambiguous: "), as_line.out
    hold = unknown.rpartition(".")[2]
    assert (await hold_state(http, gateway, tenant, hold))["state"] == "ambiguous"


async def test_a_decision_only_approval_leaves_the_hold_pending(
    cli_loop_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient, irrev: Irrev
) -> None:
    """An in-process deploy: nothing is forwarded; its tool sees the hold pending."""
    tenant = cli_loop_tenant
    created = await http.post(
        "/v1/holds", json=DEPLOY, headers=effect_headers(tenant, "deployer-01", "cli-deploy")
    )
    assert created.status_code == 202, created.text
    escalation = created.json()["escalation"]
    done = irrev("escalations", "approve", escalation, "--json")
    assert done.code == 0, done.err
    approval = json.loads(done.out)
    hold = escalation.rpartition(".")[2]
    assert (approval["effect"], approval["hold"], approval["tool_status"]) == (
        "pending",
        hold,
        None,
    )
    assert (await hold_state(http, gateway, tenant, hold))["state"] == "pending"


async def test_roles_and_tenants_bound_what_the_commands_do(
    cli_loop_tenant: Tenant,
    cli_other_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    irrev: Irrev,
) -> None:
    """The gateway's refusals, each one line with its reason code and exit 1; the
    escalation stays as it was."""
    mine, other = cli_loop_tenant, cli_other_tenant
    theirs = await escalate(http, other, "buyer-01", "cli-foreign")
    own = await escalate(http, mine, "buyer-03", "cli-viewed")
    hold = theirs.rpartition(".")[2]
    for argv, token, reason in (
        (("escalations", "approve", theirs), CLI_APPROVER, "not_found"),
        (("escalations", "reject", theirs), CLI_APPROVER, "not_found"),
        (("escalations", "list", "--tenant", other.id), CLI_APPROVER, "unknown_tenant"),
        (("holds", "show", "--tenant", other.id, hold), CLI_APPROVER, "unknown_tenant"),
        (
            ("holds", "resolve", "--tenant", other.id, hold, "voided", "--reason", "x"),
            CLI_APPROVER,
            "unknown_tenant",
        ),
        (("escalations", "approve", own), CLI_VIEWER, "insufficient_role"),
        (("escalations", "reject", own), CLI_VIEWER, "insufficient_role"),
        (("escalations", "list", "--tenant", mine.id), "not-a-token", "unauthenticated"),
    ):
        refused = irrev(*argv, token=token)
        assert refused.code == 1, (argv, refused.out, refused.err)
        assert refused.out == ""
        assert refused.err.count("\n") == 1 and refused.said.startswith(f"irrev: {reason}: ")
    assert (await hold_state(http, gateway, other, hold))["state"] == "escalated"
    own_hold = own.rpartition(".")[2]
    assert (await hold_state(http, gateway, mine, own_hold))["state"] == "escalated"
    # A viewer reads the queue and a hold, body included.
    seen = irrev("holds", "show", "--tenant", mine.id, own_hold, token=CLI_VIEWER)
    assert seen.code == 0, seen.err
    assert "  state: escalated" in seen.out and '"quantity":450' in seen.out
    assert await orders_made(upstream, other) == 0


async def test_an_ambiguous_hold_is_resolved_once(
    cli_loop_tenant: Tenant,
    gateway: Gateway,
    http: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    irrev: Irrev,
) -> None:
    tenant = cli_loop_tenant
    await set_faults(upstream, tenant, status=503)
    try:
        sent = await http.post(
            "/tools/supplier/orders",
            json=order(supplier_id="s-cli-ambiguous"),
            headers=effect_headers(tenant, "buyer-04", "cli-ambiguous"),
        )
    finally:
        await set_faults(upstream, tenant)
    hold = sent.headers["x-irrev-hold"]
    shown = irrev("holds", "show", "--tenant", tenant.id, hold, "--json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["state"] == "ambiguous"

    argv = ("holds", "resolve", "--tenant", tenant.id, hold)
    resolved = irrev(*argv, "voided", "--reason", "the supplier has no such order")
    assert resolved.code == 0, resolved.err
    assert resolved.out.strip() == f"hold {hold} of {tenant.id}: voided by cleo"
    view = await hold_state(http, gateway, tenant, hold)
    assert (view["state"], view["resolved_by"]) == ("voided", "cleo")
    assert view["resolution_note"] == "the supplier has no such order"
    # Settled the other way now: refused, and nothing changes.
    other_way = irrev(*argv, "posted", "--reason", "it was made after all")
    assert other_way.code == 1 and other_way.said.startswith("irrev: state_conflict: ")
    assert (await hold_state(http, gateway, tenant, hold))["state"] == "voided"


@pytest.mark.parametrize(
    ("argv", "token", "code", "says"),
    [
        (("escalations", "list", "--tenant", "t"), "", 2, "set IRREV_ADMIN_TOKEN"),
        (("escalations", "list", "--tenant", "t", "--limit", "0"), None, 2, "between 1 and 200"),
        (("escalations", "list"), None, 2, "--tenant"),
        (("escalations", "approve", "no-such-escalation"), None, 1, "irrev: not_found: "),
        (("escalations", "approve", "a/../../v1/admin/tenants"), None, 1, "irrev: not_found: "),
        (("holds", "resolve", "--tenant", "t", "h", "maybe", "--reason", "x"), None, 2, "maybe"),
        (("holds", "resolve", "--tenant", "t", "h", "posted"), None, 2, "--reason"),
        (("holds", "resolve", "--tenant", "t", "h", "posted", "--reason", " "), None, 2, "say"),
        (
            ("holds", "show", "--tenant", "t", "h", "--gateway", "http://127.0.0.1:1"),
            None,
            2,
            "cannot reach the gateway at http://127.0.0.1:1",
        ),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(
    irrev: Irrev, argv: tuple[str, ...], token: str | None, code: int, says: str
) -> None:
    ran = irrev(*argv) if token is None else irrev(*argv, token=token)
    assert ran.code == code, (ran.out, ran.err)
    assert ran.out == "" and "Traceback" not in ran.err
    assert says in ran.said, ran.err
