"""Locust user profile: procurement agents in front of irrev (declarative: tasks,
weights, wait times). `irrev load` runs it headless against a local gateway.

Each simulated agent holds one demo token (IRREV_LOAD_TOKENS names the demo token
file). Orders are recorded twice: as HTTP requests, and as a `decision` event named
by what irrev decided, so latency can be read per decision."""

from __future__ import annotations

import os
import random
import uuid

import yaml
from locust import HttpUser, between, task

_TOKENS = list(yaml.safe_load(open(os.environ["IRREV_LOAD_TOKENS"]))["tokens"].items())  # noqa: SIM115
_SUPPLIERS = ("acme-steel", "globex-metals", "initech-parts")
_DECISION = {201: "admit", 202: "escalate", 403: "deny"}


class ProcurementAgent(HttpUser):
    wait_time = between(0.05, 0.5)

    def on_start(self) -> None:
        self.agent, token = random.choice(_TOKENS)
        self.headers = {"Authorization": f"Bearer {token}"}

    @task(10)
    def place_order(self) -> None:
        body = {
            "supplier_id": random.choice(_SUPPLIERS),
            "sku": "bolts",
            "quantity": random.randint(1, 5),
            "unit_price": round(random.lognormvariate(4.0, 0.5), 2),
        }
        headers = {**self.headers, "Idempotency-Key": uuid.uuid4().hex}
        with self.client.post(
            "/tools/supplier/orders",
            json=body,
            headers=headers,
            name="POST order",
            catch_response=True,
        ) as response:
            decision = _DECISION.get(response.status_code, f"http {response.status_code}")
            if response.status_code in _DECISION:
                response.success()
            self.environment.events.request.fire(
                request_type="decision",
                name=decision,
                response_time=response.elapsed.total_seconds() * 1000,
                response_length=len(response.content),
                exception=None,
                context={},
            )

    @task(3)
    def browse_catalog(self) -> None:
        self.client.get("/tools/supplier/catalog", headers=self.headers, name="GET catalog")
