"""A retry's send ends while its claim lives, however long the worker stalls between
the claim and the send (contracts 4 and 6): the claim keeps other repeats from sending
the effect meanwhile, and moved the hold's deadline so that a reconciler told "not
found" cannot void it while the request may still be on its way.

In process (a real Redis and the real supplier server), since the stall must fall
exactly between the claim and the send: the ledger's retry is the real script, and
then waits as a worker busy with other requests (or paused by its GC) would."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.edge.canonical import read_request
from gateway.edge.wire import StoredRequest
from gateway.pipeline.decision import admit
from gateway.pipeline.deliver import fire
from gateway.pipeline.prepare import Gate, Intent, prepare, upstream_of
from gateway.pipeline.upstream import Answer, Fate, Upstream
from gateway.settings import GatewaySettings
from gateway.state.tenants import TenantStore
from ledger import HoldState
from ledger.client import Ledger
from ledger.errors import HoldInFlight
from ledger.keys import hold_key
from ledger.records import TransitionResult

from .helpers import order, set_faults, supplier_stats
from .servers import Server, write_policy

TIMEOUT_S, MARGIN_S = 1.0, 0.5


class StallingLedger(Ledger):
    """The ledger, whose next retry claim is followed by a stall of `stall_s`."""

    stall_s = 0.0

    async def retry(self, tenant: str, hold_id: str, window_ms: int) -> TransitionResult:
        claimed = await super().retry(tenant, hold_id, window_ms)
        stall, self.stall_s = self.stall_s, 0.0
        await asyncio.sleep(stall)
        return claimed


class Watched:
    """An upstream that says whether a send of it is under way."""

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.sending = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def deliver(
        self, effect: StoredRequest, hold_id: str, deadline: float, *, retry: bool = False
    ) -> Answer:
        self.sending = True
        try:
            return await self.inner.deliver(effect, hold_id, deadline, retry=retry)
        finally:
            self.sending = False


# Past the margin but within the send's time (it is sent, for less); past the send's
# whole time, within the claim's window (it is not sent). Both failed before: the send
# was given its whole time from after the stall, and outlived the claim.
@pytest.mark.parametrize("stall_s", [0.8, 1.2])
async def test_a_retry_stalled_after_its_claim_never_sends_past_it(
    redis_url: str, suppliers: Server, upstream: httpx.AsyncClient, tmp_path: Path, stall_s: float
) -> None:
    tenant_id = f"stall-{uuid.uuid4().hex[:10]}"
    tenant = write_policy(tmp_path, "procurement", tenant_id, f"{suppliers.url}/{tenant_id}")
    ledger = StallingLedger.from_url(redis_url)
    assert isinstance(ledger, StallingLedger)  # from_url builds its class (typed Ledger)
    try:
        store = TenantStore(tmp_path)
        await store.load(ledger)
        settings = GatewaySettings(
            policy_dir=tmp_path, upstream_timeout_s=TIMEOUT_S, forward_margin_s=MARGIN_S
        )
        async with httpx.AsyncClient(trust_env=False) as client:
            gate = Gate(settings, ledger, store, client)
            found = store.authenticate(tenant.tokens["buyer-01"])
            assert found is not None
            policy, agent = found
            body = json.dumps(order(quantity=5)).encode()
            canonical = read_request("", ["application/json"], body)
            intent = Intent(
                tool="supplier",
                operation="POST",
                target="/orders",
                canonical=canonical,
                keys=("stalled",),
            )
            prepared = prepare(policy, agent, intent, in_process=False)
            await set_faults(upstream, tenant, status=503, apply=True, times=1)
            await admit(gate, policy, agent, prepared, upstream_of(gate, policy, "supplier"))
            hold = await ledger.hold(tenant.id, prepared.hold_id)
            assert hold is not None and hold.state is HoldState.AMBIGUOUS and hold.request

            # The retry's answer never comes; its worker stalls right after the claim.
            await set_faults(upstream, tenant, hold_repeats=True, times=0)
            ledger.stall_s = stall_s
            sent = Watched(upstream_of(gate, policy, "supplier"))
            request = StoredRequest.loads(hold.request)
            first = asyncio.create_task(fire(gate, policy, hold.hold_id, request, None, sent))
            record = hold_key(tenant.id, hold.hold_id)
            while not first.done() and not await ledger.redis.hexists(record, "rc"):
                await asyncio.sleep(0.005)
            # Another repeat asks until it may send: once the first claim ended or lapsed.
            while True:
                try:
                    await ledger.retry(tenant.id, hold.hold_id, 1)
                    break
                except HoldInFlight:
                    await asyncio.sleep(0.005)
            assert not sent.sending, "the first retry was still sending when the claim lapsed"
            assert (await first).fate is Fate.UNKNOWN  # still ambiguous: it may have been made
            sends = (await supplier_stats(upstream, tenant))["requests_by_key"]
            assert sends[f"irrev-{hold.hold_id}"] == (2 if stall_s < TIMEOUT_S else 1)
    finally:
        await upstream.post(f"/{tenant_id}/_release")
        await ledger.aclose()
