"""The admission pipeline with a second, test-only `Upstream` that is not HTTP (as an
MCP tools/call upstream will not be): the same prepare -> reserve -> fire -> settle
holds, settles, replays and retries its effects, on a real Redis ledger, with no
HTTP request anywhere. The seam is the three-argument `deliver`, nothing more."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.edge.canonical import read_request
from gateway.edge.wire import StoredAnswer, StoredRequest, upstream_key
from gateway.pipeline.decision import Decision, admit
from gateway.pipeline.prepare import Gate, Intent, prepare
from gateway.pipeline.upstream import Answer, Fate, Upstream
from gateway.settings import GatewaySettings
from gateway.state.tenants import TenantStore
from ledger.client import Ledger
from ledger.journal import read_journal
from ledger.keys import accounts_key, hold_key, payload_key
from ledger.records import HoldState, Provenance
from ledger.replies import decoded
from pricing.accounts import policy_accounts
from pricing.policy import EffectClass

from .helpers import order
from .servers import Tenant, write_policy


@dataclass(frozen=True)
class Delivery:
    effect: StoredRequest
    hold_id: str
    deadline: float
    retry: bool


@dataclass
class ToolInMemory:
    """An upstream that keeps the effects it made by idempotency key and answers with
    the fates it is given, in order (then: delivered)."""

    fates: list[Fate] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    made: dict[str, bytes] = field(default_factory=dict)
    resends: bool = True  # it deduplicates by key, as a tool API does (contract 4)
    key_name: str = "Idempotency-Key"

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        self.deliveries.append(Delivery(effect, hold_id, deadline, retry))
        fate = self.fates.pop(0) if self.fates else Fate.DELIVERED
        if fate is Fate.DELIVERED and hold_id:
            self.made.setdefault(upstream_key(hold_id), effect.body)
        body = json.dumps({"tool": effect.tool, "fate": fate.value}).encode()
        return Answer(
            fate=fate, payload=body, media_type="application/json", why=f"toy_{fate.value}"
        )


@dataclass
class Pipeline:
    gate: Gate
    tenant: Tenant

    def intent(
        self, key: str, method: str = "POST", path: str = "/orders", body: bytes = b""
    ) -> Intent:
        """An order (by default) as a router would parse it; no HTTP request."""
        raw = body or (json.dumps(order()).encode() if method == "POST" else b"")
        canonical = read_request("", ["application/json"], raw)
        return Intent(
            tool="supplier", operation=method, target=path, canonical=canonical, keys=[key]
        )

    async def admit(self, upstream: Upstream, intent: Intent) -> Decision | Answer:
        found = self.gate.tenants.authenticate(self.tenant.tokens["buyer-01"])
        assert found is not None
        policy, agent = found
        prepared = prepare(policy, agent, intent, in_process=False)
        return await admit(self.gate, policy, agent, prepared, upstream)

    async def state(self, hold_id: str) -> HoldState:
        hold = await self.gate.ledger.hold(self.tenant.id, hold_id)
        assert hold is not None
        return hold.state


# Nothing listens at the policies' upstream URL: only the test's upstream delivers.
NOWHERE = "http://127.0.0.1:9"


@asynccontextmanager
async def serving(redis_url: str, directory: Path) -> AsyncIterator[Gate]:
    """A worker's gate serving the policies written in `directory`."""
    settings = GatewaySettings(policy_dir=directory)
    ledger = Ledger.from_url(redis_url)
    tenants = TenantStore(directory, settings.forward_budget())
    await tenants.load(ledger)
    async with httpx.AsyncClient() as http:
        yield Gate(settings, ledger, tenants, http)
    await ledger.aclose()


@pytest.fixture
async def pipeline(redis_url: str, tmp_path: Path, tenant: str) -> AsyncIterator[Pipeline]:
    written = write_policy(tmp_path, "procurement", tenant, NOWHERE)
    async with serving(redis_url, tmp_path) as gate:
        yield Pipeline(gate, written)


@pytest.fixture
async def neighbours(
    redis_url: str, tmp_path: Path, tenant: str
) -> AsyncIterator[tuple[Pipeline, Pipeline]]:
    """Two tenants one gate serves."""
    first = write_policy(tmp_path, "procurement", tenant, NOWHERE)
    second = write_policy(tmp_path, "procurement", f"{tenant}-b", NOWHERE)
    async with serving(redis_url, tmp_path) as gate:
        yield Pipeline(gate, first), Pipeline(gate, second)


def _admitted(outcome: Decision | Answer) -> Decision:
    assert isinstance(outcome, Decision), outcome
    return outcome


async def test_a_second_upstream_is_held_delivered_posted_and_replayed(
    pipeline: Pipeline,
) -> None:
    tool = ToolInMemory()
    first = _admitted(await pipeline.admit(tool, pipeline.intent("k1")))
    assert isinstance(first.answer, Answer) and first.answer.fate is Fate.DELIVERED
    assert [(d.hold_id, d.retry) for d in tool.deliveries] == [(first.hold_id, False)]
    delivery = tool.deliveries[0]
    assert delivery.effect.route_id == "supplier POST /orders"
    assert delivery.effect.price == first.result.price > 0
    assert delivery.deadline <= time.monotonic() + pipeline.gate.settings.upstream_timeout_s
    assert await pipeline.state(first.hold_id) is HoldState.POSTED
    hold = await pipeline.gate.ledger.hold(pipeline.tenant.id, first.hold_id)
    assert hold is not None and hold.posted == hold.amounts

    again = _admitted(await pipeline.admit(tool, pipeline.intent("k1")))
    assert again.hold_id == first.hold_id and again.result.replayed
    assert isinstance(again.answer, StoredAnswer)
    # Kept in HTTP's shape, under the status a delivered fate has there.
    assert (again.answer.status, again.answer.body) == (200, first.answer.payload)
    assert again.answer.headers == [("content-type", "application/json")]
    assert len(tool.deliveries) == 1 and len(tool.made) == 1


async def test_an_answer_kept_in_the_long_form_of_older_gateways_is_still_replayed(
    pipeline: Pipeline,
) -> None:
    """Old and new gateways share a Redis during a rolling upgrade: an answer an older
    gateway kept (one JSON object with the field names, body in base64, as main wrote
    it before issue 12's compact form) still serves a repeat, whole."""
    tool = ToolInMemory()
    first = _admitted(await pipeline.admit(tool, pipeline.intent("k1")))
    assert isinstance(first.answer, Answer)
    redis, record = pipeline.gate.ledger.redis, hold_key(pipeline.tenant.id, first.hold_id)
    hold = await pipeline.gate.ledger.hold(pipeline.tenant.id, first.hold_id)
    assert hold is not None and hold.outcome.startswith('{"a":')
    # As an older irrev kept it: not in the record's parts but as the payload.
    names: list[str] = await decoded(redis.hkeys(record))
    parts = [name for name in names if re.fullmatch(r"o\d+", name)]
    assert parts and await redis.hdel(record, *parts) == len(parts)
    old = {
        "agent": "buyer-01",
        "status": 201,
        "headers": [["content-type", "application/json"]],
        "body_b64": base64.b64encode(first.answer.payload).decode(),
        "route_id": "supplier POST /orders",
        "face_value": 7,
        "effect_class": "",
        "in_process": False,
    }
    payload = payload_key(pipeline.tenant.id, first.hold_id)
    await redis.set(payload, json.dumps(old, separators=(",", ":")), px=3_600_000)

    again = _admitted(await pipeline.admit(tool, pipeline.intent("k1")))
    assert again.result.replayed and isinstance(again.answer, StoredAnswer)
    assert (again.answer.status, again.answer.body) == (201, first.answer.payload)
    assert again.answer.headers == [("content-type", "application/json")]
    assert (again.answer.route_id, again.answer.face_value) == ("supplier POST /orders", 7)
    assert len(tool.deliveries) == 1


async def test_an_unknown_fate_is_retried_under_the_same_key_until_known(
    pipeline: Pipeline,
) -> None:
    tool = ToolInMemory([Fate.UNKNOWN, Fate.IN_PROGRESS, Fate.DELIVERED])
    first = _admitted(await pipeline.admit(tool, pipeline.intent("k2")))
    assert isinstance(first.answer, Answer) and first.answer.fate is Fate.UNKNOWN
    hold = await pipeline.gate.ledger.hold(pipeline.tenant.id, first.hold_id)
    assert hold is not None and (hold.state, hold.ambiguity) == (
        HoldState.AMBIGUOUS,
        "toy_unknown",
    )

    still = _admitted(await pipeline.admit(tool, pipeline.intent("k2")))
    assert isinstance(still.answer, Answer) and still.answer.fate is Fate.IN_PROGRESS
    assert await pipeline.state(first.hold_id) is HoldState.AMBIGUOUS

    done = _admitted(await pipeline.admit(tool, pipeline.intent("k2")))
    assert isinstance(done.answer, Answer) and done.answer.fate is Fate.DELIVERED
    assert await pipeline.state(first.hold_id) is HoldState.POSTED
    assert [(d.hold_id, d.retry) for d in tool.deliveries] == [
        (first.hold_id, False),
        (first.hold_id, True),
        (first.hold_id, True),
    ]
    assert len({d.effect for d in tool.deliveries}) == 1


@pytest.mark.parametrize("fate", [Fate.REFUSED, Fate.NOT_SENT])
async def test_a_retry_refused_or_unsent_leaves_the_hold_ambiguous(
    pipeline: Pipeline, fate: Fate
) -> None:
    """The retry's fate says nothing about the first send's: still ambiguous, charged."""
    tool = ToolInMemory([Fate.UNKNOWN, fate])
    first = _admitted(await pipeline.admit(tool, pipeline.intent(f"k-retry-{fate.value}")))
    again = _admitted(await pipeline.admit(tool, pipeline.intent(f"k-retry-{fate.value}")))
    assert isinstance(again.answer, Answer) and again.answer.fate is Fate.UNKNOWN
    assert again.answer.why == f"retry_toy_{fate.value}"
    assert await pipeline.state(first.hold_id) is HoldState.AMBIGUOUS


@pytest.mark.parametrize(("fate", "status"), [(Fate.REFUSED, 422), (Fate.NOT_SENT, 502)])
async def test_a_refused_or_unsent_effect_is_voided_with_its_answer_kept(
    pipeline: Pipeline, fate: Fate, status: int
) -> None:
    tool = ToolInMemory([fate])
    first = _admitted(await pipeline.admit(tool, pipeline.intent(f"k-{fate.value}")))
    assert await pipeline.state(first.hold_id) is HoldState.VOIDED
    again = _admitted(await pipeline.admit(tool, pipeline.intent(f"k-{fate.value}")))
    assert isinstance(again.answer, StoredAnswer) and again.answer.status == status
    assert len(tool.deliveries) == 1 and not tool.made


async def test_a_read_is_delivered_without_a_key_or_a_hold(pipeline: Pipeline) -> None:
    tool = ToolInMemory()
    read = await pipeline.admit(tool, pipeline.intent("unused", "GET", "/orders/o-1"))
    assert isinstance(read, Answer) and read.fate is Fate.DELIVERED
    [delivery] = tool.deliveries
    assert delivery.hold_id == "" and not delivery.retry
    assert delivery.effect.effect_class == EffectClass.READ.value
    assert not tool.made


async def test_an_escalated_effect_waits_for_a_human_before_any_delivery(
    pipeline: Pipeline,
) -> None:
    tool = ToolInMemory()
    # 40,000 USD face prices above the route's 30,000 USD approval threshold.
    big = json.dumps(order(quantity=1, unit_price="40000")).encode()
    escalated = _admitted(await pipeline.admit(tool, pipeline.intent("k-big", body=big)))
    assert escalated.answer is None and escalated.result.state is HoldState.ESCALATED
    assert await pipeline.state(escalated.hold_id) is HoldState.ESCALATED
    assert tool.deliveries == []


async def test_the_journal_says_who_asked_for_an_effect_and_what_was_sent(
    pipeline: Pipeline,
) -> None:
    """Issue 14: a month later, the reserve's journal entry still proves what was
    paid to whom: route, agent, principal, face value, the agent's key and the
    digest of the request as forwarded."""
    tool = ToolInMemory()
    first = _admitted(await pipeline.admit(tool, pipeline.intent("k-prov")))
    sent = tool.deliveries[0].effect
    found = pipeline.gate.tenants.authenticate(pipeline.tenant.tokens["buyer-01"])
    assert found is not None
    _, agent = found
    entries = await read_journal(pipeline.gate.ledger, pipeline.tenant.id)
    (reserve,) = [e for e in entries if e.op == "reserve" and e.hold_id == first.hold_id]
    assert reserve.provenance == Provenance(
        route="supplier POST /orders",
        agent=agent.agent_id,
        principal=agent.principal_id,
        face_value=sent.face_value,
        agent_key="k-prov",
        request_sha256=hashlib.sha256(sent.dumps().encode()).hexdigest(),
    )


def policy_account_ids(pipeline: Pipeline) -> set[str]:
    policy = pipeline.gate.tenants.policies[pipeline.tenant.id]
    return {spec.account_id for spec in policy_accounts(policy)}


async def account_ids(pipeline: Pipeline) -> set[str]:
    return {b.account for b in await pipeline.gate.ledger.balances(pipeline.tenant.id)}


async def test_an_unknown_account_opens_its_tenants_accounts_and_reloads_no_tenant(
    neighbours: tuple[Pipeline, Pipeline], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31: a reserve that met an account Redis lacked reloaded every tenant (each
    policy file, store record and account of the fleet, per miss). Now it opens the
    accounts its own tenant lacks and reloads nothing: a neighbour's lost accounts
    stay lost until its own reserve meets them, and its edited file waits for the
    refresh that every worker runs anyway."""
    a, b = neighbours
    gate = a.gate
    # Redis lost both tenants' accounts (a failover to a replica that missed them).
    await gate.ledger.redis.delete(accounts_key(a.tenant.id), accounts_key(b.tenant.id))
    b_file = tmp_path / f"{b.tenant.id}.yaml"
    edited = yaml.safe_load(b_file.read_text())
    edited["max_escalations"] = 7
    b_file.write_text(yaml.safe_dump(edited))
    b_in_force = gate.tenants.served(b.tenant.id)
    with caplog.at_level(logging.WARNING, logger="irrev.gateway"):
        posted = _admitted(await a.admit(ToolInMemory(), a.intent("k-lost")))
    assert await a.state(posted.hold_id) is HoldState.POSTED
    assert await account_ids(a) >= policy_account_ids(a)
    opened = [
        (vars(r)["tenant"], vars(r)["accounts"])  # the log call's `extra`
        for r in caplog.records
        if r.msg == "opened missing accounts"
    ]
    assert opened == [(a.tenant.id, len(policy_account_ids(a)))]
    # Tenant b: neither its accounts written nor its file read.
    assert await account_ids(b) == set()
    assert gate.tenants.served(b.tenant.id) is b_in_force
    assert gate.tenants.policies[b.tenant.id].document.max_escalations != 7
    # Its own reserve opens its accounts, from the policy it serves.
    _admitted(await b.admit(ToolInMemory(), b.intent("k-lost")))
    assert await account_ids(b) >= policy_account_ids(b)


async def test_a_burst_on_lost_accounts_writes_each_account_once(pipeline: Pipeline) -> None:
    """Reserves of one tenant that meet its lost accounts at once wait for one opening:
    each would otherwise read that they are missing and write them all again."""
    gate, tenant = pipeline.gate, pipeline.tenant.id
    before = await read_journal(gate.ledger, tenant)
    await gate.ledger.redis.delete(accounts_key(tenant))
    tool = ToolInMemory()
    burst = [pipeline.admit(tool, pipeline.intent(f"k-burst-{i}")) for i in range(8)]
    for outcome in await asyncio.gather(*burst):
        assert await pipeline.state(_admitted(outcome).hold_id) is HoldState.POSTED
    since = await read_journal(gate.ledger, tenant, after=before[-1].entry_id)
    wanted = policy_account_ids(pipeline)
    # (The order's supplier account is opened by its reserve: reserve.lua's own.)
    written = Counter(e.fields["acct"] for e in since if e.op == "account")
    assert {account: written[account] for account in wanted} == dict.fromkeys(wanted, 1)
