"""An approval looks up where the effect goes before it claims the hold: a policy
change that dropped the tool's upstream meanwhile is refused with the hold still
escalated (rejectable, expiring as usual). Before, the claim came first and the
hold, pending with nowhere to go, turned ambiguous and stayed charged."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.edge.canonical import read_request
from gateway.edge.problems import Problem
from gateway.pipeline.approve import approve
from gateway.pipeline.prepare import Gate, Intent, prepare
from gateway.pipeline.reserve import reserve
from gateway.settings import GatewaySettings
from gateway.state.tenants import TenantStore
from ledger import HoldState
from ledger.client import Ledger

from .helpers import order
from .servers import write_policy


async def test_an_approval_whose_upstream_is_gone_leaves_the_hold_escalated(
    redis_url: str, tmp_path: Path
) -> None:
    tenant = write_policy(tmp_path, "procurement", f"t-{uuid.uuid4().hex[:10]}", "http://x")
    ledger = Ledger.from_url(redis_url)
    try:
        store = TenantStore(tmp_path)
        await store.load(ledger)
        async with httpx.AsyncClient(trust_env=False) as client:
            gate = Gate(GatewaySettings(policy_dir=tmp_path), ledger, store, client)
            found = store.authenticate(tenant.tokens["buyer-01"])
            assert found is not None
            policy, agent = found
            body = json.dumps(order(quantity=450)).encode()  # above the approval threshold
            canonical = read_request("", ["application/json"], body)
            intent = Intent(
                tool="supplier",
                operation="POST",
                target="/orders",
                canonical=canonical,
                keys=("gone",),
            )
            prepared = prepare(policy, agent, intent, in_process=False)
            result = await reserve(gate, policy, agent, prepared)
            assert result.state is HoldState.ESCALATED

            # The operator removes the supplier tool (and its routes) meanwhile.
            path = tmp_path / f"{tenant.id}.yaml"
            data = yaml.safe_load(path.read_text())
            del data["tools"]["supplier"]
            data["routes"] = [r for r in data["routes"] if r["tool"] != "supplier"]
            path.write_text(yaml.safe_dump(data))
            await store.apply(ledger)
            with pytest.raises(Problem) as refused:
                await approve(gate, store.policies[tenant.id], prepared.hold_id, "alice")
            assert refused.value.reason == "no_upstream"
            hold = await ledger.hold(tenant.id, prepared.hold_id)
            assert hold is not None and hold.state is HoldState.ESCALATED
    finally:
        await ledger.aclose()
