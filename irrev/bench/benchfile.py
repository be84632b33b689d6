"""Locust profile for `irrev bench gateway`: one order per request, each with its own
idempotency key, from agents whose tokens arrive in IRREV_BENCH_TOKENS. Closed loop
(no wait) by default; with IRREV_BENCH_RATE, each user keeps that many requests per
second (an open-ish loop at users x rate)."""

from __future__ import annotations

import itertools
import os

from locust import FastHttpUser, constant, constant_throughput, task

_TOKENS = os.environ["IRREV_BENCH_TOKENS"].split(",")
_RATE = float(os.environ.get("IRREV_BENCH_RATE", "0"))
_BODY = '{"supplier_id":"acme-steel","sku":"bolts","quantity":1,"unit_price":0.05}'
_KEYS = itertools.count()


class BenchAgent(FastHttpUser):
    wait_time = constant_throughput(_RATE) if _RATE else constant(0)

    @task
    def order(self) -> None:
        n = next(_KEYS)
        self.client.post(
            "/tools/supplier/orders",
            data=_BODY,
            headers={
                "Authorization": f"Bearer {_TOKENS[n % len(_TOKENS)]}",
                "Content-Type": "application/json",
                "Idempotency-Key": f"bench-{os.getpid()}-{n}",
            },
            name="order",
        )
