"""Parser differentials: the gateway prices a request with one reading, the tool API
behind it may use another. Each run adds a tenant whose tool's upstream executes
nothing and reports how eleven real-world parsers read every request it receives
(irrev/upstreams/readers.py: case-insensitive JSON, first-key JSON, `;`-splitting queries,
servlet-style query-over-body, method overrides, Tomcat path normalisation, lenient
routing, form sniffing, PHP's and Rack 2's form names). A battery of honest requests
and differential attacks goes through the gateway; for each one:

- a 2xx was forwarded once, and every reader reads the method, path and amount that
  were priced (the amount as X-Irrev-Price, at face value);
- a 4xx is the gateway's problem+json and the upstream received nothing;
- honest requests are admitted (a gateway that refused everything would pass);
- the tenant's journal replays to its balances, and it was charged exactly the sum
  of the admitted prices.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import httpx

from irrev.harness import PolicyDraft
from ledger import audit_tenant

from ..bench import Run
from ..matrix import Cell

AGENT = "buyer-01"
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
POLICY = PolicyDraft.parse("""\
tenant: set-per-run
risk_unit: {currency: USD, scale: 1000000}
window: 24h
soft_band: 0.99
escalation_ttl: 10m
hold_ttl: 3s
unknown_routes: {action: price_as_irreversible, face_value: amount}
accounts:
  tenant: {limit: "1000000"}
  principals:
    procurement: {limit: "1000000"}
tools:
  pay: {upstream: set-per-run}
routes:
  - {tool: pay, route: POST /payments, class: irreversible, body: [payee, amount],
      face_value: amount}
  - {tool: pay, route: POST /transfers, class: irreversible, query: [amount],
      face_value: amount}
  - {tool: pay, route: POST /charges, class: irreversible, body_format: form,
      body: [amount, currency], face_value: amount, amount_scale: 100,
      currency_field: currency}
  - {tool: pay, route: "GET /payments/{payment_id}", class: read}
agents: {}
""")
# Amount scale (1/n major units) of each route's amount field; others: major units.
SCALES = {"/charges": Decimal(100)}


@dataclass(frozen=True, kw_only=True)
class Probe:
    name: str
    method: str
    target: str  # below /tools/pay, sent byte for byte
    body: bytes = b""
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)
    honest: bool = False


def _json(text: str) -> bytes:
    return text.encode()


PROBES = [
    # Honest requests: each must be admitted and read alike by every parser.
    Probe(
        name="json",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":3}'),
        honest=True,
    ),
    Probe(
        name="json spaced, charset",
        method="POST",
        target="/payments",
        body=_json('{ "payee" : "p1",\n "amount" : 2.50 }'),
        content_type=f"{JSON}; charset=utf-8",
        honest=True,
    ),
    Probe(
        name="declared query",
        method="POST",
        target="/transfers?amount=4",
        body=b"",
        content_type="",
        honest=True,
    ),
    Probe(
        name="form, cents",
        method="POST",
        target="/charges",
        body=b"amount=250&currency=usd",
        content_type=FORM,
        honest=True,
    ),
    Probe(
        name="read",
        method="GET",
        target="/payments/p1?expand=payee",
        body=b"",
        content_type="",
        honest=True,
    ),
    Probe(
        name="unknown route",
        method="POST",
        target="/payouts",
        body=_json('{"amount":2}'),
        honest=True,
    ),
    # Case-insensitive, first-wins and escaped JSON keys.
    Probe(
        name="Amount beside amount",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"Amount":7000}'),
    ),
    Probe(
        name="escaped Amount",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"\\u0041mount":7000}'),
    ),
    Probe(
        name="nested case keys",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"m":{"a":1,"A":2}}'),
    ),
    Probe(
        name="duplicate amount",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":7000,"amount":1}'),
    ),
    # Method overrides.
    Probe(
        name="_method in query",
        method="POST",
        target="/payments?_method=DELETE",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="_method in body",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"_method":"DELETE"}'),
    ),
    Probe(
        name="override header",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1}'),
        headers={"X-HTTP-Method-Override": "DELETE"},
    ),
    Probe(
        name="_method on a read",
        method="GET",
        target="/payments/p1?_method=DELETE",
        body=b"",
        content_type="",
    ),
    Probe(
        name="_method in a form",
        method="POST",
        target="/charges",
        body=b"amount=100&currency=usd&_method=DELETE",
        content_type=FORM,
    ),
    # Query beside body, ';' and case in queries.
    Probe(
        name="amount in query",
        method="POST",
        target="/payments?amount=7000",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="semicolon query",
        method="POST",
        target="/transfers?amount=1&x=1;amount=7000",
        body=b"",
        content_type="",
    ),
    Probe(
        name="semicolon read",
        method="GET",
        target="/payments/p1?a=1;_method=DELETE",
        body=b"",
        content_type="",
    ),
    Probe(
        name="Amount in query",
        method="POST",
        target="/transfers?amount=1&Amount=7000",
        body=b"",
        content_type="",
    ),
    Probe(
        name="query and body",
        method="POST",
        target="/transfers?amount=1",
        body=_json('{"amount":7000}'),
    ),
    # Content types.
    Probe(
        name="form profile=json",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"x":"&amount=7000&y="}'),
        content_type=f"{FORM}; profile=json",
    ),
    Probe(
        name="form pairs in a JSON string",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1,"x":"&amount=7000&y=;amount=7000"}'),
    ),
    Probe(
        name="text/json",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1}'),
        content_type="text/json",
    ),
    Probe(
        name="json; x=1",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1}'),
        content_type=f"{JSON}; x=1",
    ),
    Probe(
        name="form to a json route",
        method="POST",
        target="/payments",
        body=b"payee=p1&amount=1",
        content_type=FORM,
    ),
    Probe(
        name="json to a form route",
        method="POST",
        target="/charges",
        body=_json('{"amount":100,"currency":"usd"}'),
    ),
    Probe(
        name="form semicolon",
        method="POST",
        target="/charges",
        body=b"amount=100;amount=700000&currency=usd",
        content_type=FORM,
    ),
    Probe(
        name="form case",
        method="POST",
        target="/charges",
        body=b"amount=100&Amount=700000&currency=usd",
        content_type=FORM,
    ),
    Probe(
        name="form brackets",
        method="POST",
        target="/charges",
        body=b"amount=100&amount[]=700000&currency=usd",
        content_type=FORM,
    ),
    Probe(
        name="form currency",
        method="POST",
        target="/charges",
        body=b"amount=100&currency=eur",
        content_type=FORM,
    ),
    # Form names PHP or Rack 2 read as `amount`.
    Probe(
        name="form space",
        method="POST",
        target="/charges",
        body=b"amount=100&+amount=700000&currency=usd",
        content_type=FORM,
    ),
    Probe(
        name="form NUL",
        method="POST",
        target="/charges",
        body=b"amount=100&amount%00x=700000&currency=usd",
        content_type=FORM,
    ),
    Probe(
        name="form bracketed",
        method="POST",
        target="/charges",
        body=b"amount=100&[amount]=700000&currency=usd",
        content_type=FORM,
    ),
    # Paths an upstream normalises into another route.
    Probe(
        name="..; segment",
        method="POST",
        target="/x/..;/payments",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="..; on a read",
        method="GET",
        target="/payments/..;/transfers",
        body=b"",
        content_type="",
    ),
    Probe(
        name="matrix parameter",
        method="POST",
        target="/payments;v=2",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="case alias",
        method="POST",
        target="/Payments",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="extension alias",
        method="POST",
        target="/payments.json",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="format alias",
        method="POST",
        target="/payments.x-y",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="suffix alias",
        method="POST",
        target="/payments.json.x",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    Probe(
        name="encoded slash",
        method="POST",
        target="/x%2F..%2Fpayments",
        body=_json('{"payee":"p1","amount":1}'),
    ),
    # Amounts no Decimal context holds.
    Probe(
        name="1e999999",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1e999999}'),
    ),
    Probe(
        name="1e-999999",
        method="POST",
        target="/payments",
        body=_json('{"payee":"p1","amount":1e-999999}'),
    ),
]


async def add_reader_tenant(run: Run) -> str:
    """A tenant whose one tool's upstream is the supplier's parser readings."""
    tenant = f"{run.tenant[:40]}-d"
    policy = POLICY.copy().named(tenant)
    policy.point(f"{run.bench.supplier.url}/_readers/{tenant}")
    policy.add_agent(AGENT, principal="procurement", per_effect_cap="100000", window_cap="1000000")
    policy.write(run.bench.policy_dir)
    run.tenants.append(tenant)
    run.tokens[tenant] = policy.tokens
    await run.reload()
    return tenant


async def readings(run: Run, tenant: str) -> list[dict[str, Any]]:
    response = await run.bench.http.get(f"{run.bench.supplier.url}/_readers/_readings/{tenant}")
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()
    return found


def misread(probe: Probe, price: int, record: dict[str, Any]) -> list[str]:
    """How the readers' view of one forwarded request differs from what was priced."""
    path = unquote(probe.target.partition("?")[0])
    scale = SCALES.get(path, Decimal(1))
    found = []
    for name, reading in record["readings"].items():
        if (reading["method"], reading["path"]) != (probe.method, path):
            found.append(f"{name} reads {reading['method']} {reading['path']}")
        if probe.method == "GET":
            continue
        # The amount as a lenient number parser reads it (the readers say so).
        amount = None if reading["amount"] is None else Decimal(reading["amount"])
        if amount is None and name == "strict":
            found.append(f"{name} reads no amount")
        elif amount is not None and amount / scale * 10**6 != price:
            found.append(f"{name} reads amount {amount}, priced {price} micros")
    return [f"{probe.name}: {f}" for f in found]


async def send(run: Run, tenant: str, probe: Probe) -> httpx.Response:
    headers = {**run.agent_headers(AGENT, tenant), **probe.headers}
    if probe.method != "GET":
        headers["Idempotency-Key"] = uuid.uuid4().hex
    if probe.content_type:
        headers["Content-Type"] = probe.content_type
    url = httpx.URL(f"{run.url()}/tools/pay").copy_with(
        raw_path=f"/tools/pay{probe.target}".encode()
    )
    return await run.bench.http.request(probe.method, url, content=probe.body, headers=headers)


async def check_probe(run: Run, tenant: str, probe: Probe) -> tuple[list[str], int]:
    """The violations of one probe, and the price it was charged."""
    seen = len(await readings(run, tenant))
    try:
        response = await send(run, tenant, probe)
    except httpx.HTTPError as exc:
        return [f"{probe.name}: no answer ({type(exc).__name__})"], 0
    records = (await readings(run, tenant))[seen:]
    status = response.status_code
    if 200 <= status < 300:
        if len(records) != 1:
            return [f"{probe.name}: admitted, forwarded {len(records)} times"], 0
        price = int(response.headers.get("x-irrev-price", "0"))
        return misread(probe, price, records[0]), price
    found = (
        [f"{probe.name}: honest request got {status} {response.text[:120]}"] if probe.honest else []
    )
    if not 400 <= status < 500:
        found.append(f"{probe.name}: got {status}, want 2xx or a 4xx refusal")
    elif not response.headers.get("content-type", "").startswith("application/problem+json"):
        found.append(f"{probe.name}: {status} is not problem+json")
    if records:
        found.append(f"{probe.name}: refused ({status}) but the upstream received it")
    return found, 0


async def differential(run: Run) -> list[str]:
    tenant = await add_reader_tenant(run)
    found: list[str] = []
    charged = 0
    for probe in PROBES:
        violations, price = await check_probe(run, tenant, probe)
        found += violations
        charged += price
    report = await audit_tenant(run.bench.ledger, tenant)
    found += [f"audit: {m}" for m in report.mismatches]
    for balance in await run.bench.ledger.balances(tenant):
        if balance.account == f"tenant:{tenant}" and balance.used != charged:
            found.append(f"charged {balance.used} micros, admitted prices sum to {charged}")
    return found


CELLS = [
    Cell(
        name="differential.parsers",
        checked="every forward reads as the priced method, route and amount to 11 parsers, or 4xx "
        "and nothing sent",
        body=differential,
    ),
]
