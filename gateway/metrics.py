"""Prometheus metrics. With several uvicorn workers, `irrev serve` sets
PROMETHEUS_MULTIPROC_DIR so that any worker's /metrics reports all of them; hold
counts come from Redis at scrape time, so they are the fleet's, not a worker's."""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
PRICE_BUCKETS = tuple(float(10**k) for k in range(0, 13))

DECISIONS = Counter(
    "irrev_decisions_total", "Admission decisions", ["tenant", "decision", "reason"]
)
PRICES = Histogram(
    "irrev_price_micros", "Prices of effects put to the ledger", ["tenant"], buckets=PRICE_BUCKETS
)
LEDGER_SECONDS = Histogram(
    "irrev_ledger_seconds", "Ledger round trips", ["operation"], buckets=LATENCY_BUCKETS
)
UPSTREAM_SECONDS = Histogram(
    "irrev_upstream_seconds", "Upstream requests", ["tool"], buckets=LATENCY_BUCKETS
)
FLAGGED_OUTCOMES = Counter(
    "irrev_flagged_outcomes_total",
    "Effects posted above their hold (overrun) or after it expired (late): the world "
    "exceeded what was reserved; an overrun account refuses admissions until it is "
    "back under its limit",
    ["tenant", "flag"],
)
JOURNAL_TRIMMED = Counter(
    "irrev_journal_trimmed_total", "Journal entries archived and trimmed from Redis", ["tenant"]
)
UPSTREAM_OUTCOMES = Counter(
    "irrev_upstream_outcomes_total", "What forwarded effects came to", ["tool", "fate"]
)


class _HoldCounts:
    def __init__(self, counts: dict[tuple[str, str], int]) -> None:
        self.counts = counts

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "irrev_live_holds", "Live holds by state (from the ledger)", labels=["tenant", "state"]
        )
        for (tenant, state), count in sorted(self.counts.items()):
            family.add_metric([tenant, state], count)
        return [family]


class _WithoutTenants:
    """Every family of `source` without its tenant label: samples that differed only by
    tenant are summed (counts, sums, buckets and live holds all add up), so a caller
    who may not know the tenants still sees the fleet's totals."""

    def __init__(self, source: Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # a creation time per tenant: no sum of them means anything
                labels = tuple((k, v) for k, v in sample.labels.items() if k != "tenant")
                key = (sample.name, labels)
                summed[key] = summed.get(key, 0.0) + sample.value
            merged = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels), value in summed.items():
                merged.add_sample(name, dict(labels), value)
            yield merged


def exposition(hold_counts: dict[tuple[str, str], int], *, tenant_labels: bool) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        own: Collector = CollectorRegistry()
        multiprocess.MultiProcessCollector(own)
    else:
        from prometheus_client import REGISTRY

        own = REGISTRY
    holds = CollectorRegistry()
    holds.register(_HoldCounts(hold_counts))
    if tenant_labels:
        return generate_latest(own) + generate_latest(holds)
    return generate_latest(_WithoutTenants(own)) + generate_latest(_WithoutTenants(holds))
