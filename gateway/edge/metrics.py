"""Prometheus metrics. With several uvicorn workers, `irrev serve` sets
PROMETHEUS_MULTIPROC_DIR so that any worker's /metrics reports all of them.

Two kinds of series: counters and histograms each worker keeps (summed over the
workers), and gauges computed when /metrics is scraped: the fleet's state read from
Redis by the one worker that answers the scrape (hold counts, budgets, the
escalation and ambiguous queues: `Ledger.snapshot`, two round trips), and that
worker's view of the policies in force (every worker reloads the same files)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ledger import RULE_PREFIX, TenantSnapshot

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
PRICE_BUCKETS = tuple(float(10**k) for k in range(0, 13))

DECISIONS = Counter(
    "irrev_decisions_total",
    'Admission decisions; mode="shadow": what enforcement would have decided on a '
    "shadow-mode route, whose effect was held and forwarded whatever the decision",
    ["tenant", "decision", "reason", "mode"],
)
PRICES = Histogram(
    "irrev_price_micros", "Prices of effects put to the ledger", ["tenant"], buckets=PRICE_BUCKETS
)
LEDGER_SECONDS = Histogram(
    "irrev_ledger_seconds", "Ledger round trips", ["operation"], buckets=LATENCY_BUCKETS
)
LEDGER_GROUPS = Histogram(
    "irrev_ledger_group_size",
    "Calls per script call sent by group commit (IRREV_GROUP_WAIT_MS), by operation "
    "(reserve, post): 1 for a call that went alone",
    ["operation"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
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
STRESS_TRIPS = Counter(
    "irrev_stress_trips_total",
    "Times a route's stress detector turned on (counted once across the fleet: by the "
    "gateway whose request tripped it)",
    ["tenant", "route"],
)
STRESSED_EFFECTS = Counter(
    "irrev_stressed_effects_total",
    "Effects priced stressed because their route's stress detector was on",
    ["tenant", "route"],
)


REFUSALS = Counter(
    "irrev_refusals_total",
    "Requests answered with application/problem+json, by reason, wherever refused: "
    "authentication, validation, pricing, per-effect caps and scopes, the ledger",
    ["tenant", "reason", "status"],
)
ADMIN_DECISIONS = Counter(
    "irrev_admin_decisions_total",
    "Escalations approved or rejected, by whom: an admin, or rule (an auto-approval rule)",
    ["tenant", "admin", "decision"],
)
# Labels that name who or what (tenants, admins, which may be e-mail addresses, and
# upstream tools): shown only to callers who may see tenants; anyone else gets the
# series summed over them.
NAMING_LABELS = frozenset({"tenant", "admin", "tool"})


def admin_label(admin: str) -> str:
    """An admin's name, or "rule" for any auto-approval rule ("rule:<id>"): rules come
    and go without bound, and a series per rule would grow the scrape with them (the
    id is in the log line and the journal)."""
    return "rule" if admin.startswith(RULE_PREFIX) else admin


POLICY_RELOADS = Counter(
    "irrev_policy_reloads_total",
    "Policy files a worker loaded: applied, or failed (its tenant keeps the policy it had)",
    ["tenant", "result"],
)
WEBHOOK_DELIVERIES = Counter(
    "irrev_webhook_deliveries_total",
    "Webhook delivery attempts, by result (delivered, failed: retried with backoff)",
    ["tenant", "result"],
)
RECONCILED = Counter(
    "irrev_reconciled_total",
    "Ambiguous holds the reconciler looked at, by result",
    ["tenant", "result"],
)
UNACKNOWLEDGED_WRITES = Counter(
    "irrev_unacknowledged_writes_total",
    "Posts and true-ups (op: post, trueup) recorded although their wait for replicas or "
    "fsyncs (IRREV_WAIT_REPLICAS, IRREV_WAIT_AOF) came back short: the effect happened, "
    "so they are kept, but a failover or restart within the window can lose them",
    ["op"],
)
SWEEPS = Counter(
    "irrev_sweeps_total",
    "Sweeps of a tenant's due holds by this process (one process of the fleet holds each "
    "tenant's sweep lease at a time)",
    ["tenant"],
)
ACCOUNTS_CLOSED = Counter(
    "irrev_accounts_closed_total",
    "Risk-factor accounts closed by this process because they held nothing since their "
    "window ended (opened again on their next effect)",
    ["tenant"],
)
HOLDS_ARCHIVED = Counter(
    "irrev_holds_archived_total",
    "Settled holds this process took out of their tenant's Redis slot into archived "
    "copies (ledger/archive.py)",
    ["tenant"],
)
BODIES_OMITTED = Counter(
    "irrev_answer_bodies_omitted_total",
    "Settled holds whose answer was kept without its body, by reason: too_large (over "
    "256 KiB), kept_answer_allowance (past the agent's request_limits.kept_answer_bytes "
    "of the UTC day); a repeat of the call gets the status, headers, length and digest",
    ["tenant", "reason"],
)
BODY_BYTES_OMITTED = Counter(
    "irrev_answer_body_bytes_omitted_total",
    "Bytes of answer bodies not kept in Redis for repeats (irrev_answer_bodies_omitted_total)",
    ["tenant", "reason"],
)
Labelled = TypeVar("Labelled", bound=MetricWrapperBase)
_CHILDREN: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}


def child(metric: Labelled, *values: str) -> Labelled:
    """`metric.labels(*values)`, looked up in a dict after its first time: labels()
    takes a lock and converts every value on each call, eight times on an admitted
    request's path. The series are the same; nothing ever removes one."""
    key = (metric, values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*values)
    return found  # type: ignore[return-value]


HTTP_REQUESTS = Counter(
    "irrev_http_requests_total", "HTTP requests by route template", ["method", "route", "status"]
)
HTTP_SECONDS = Histogram(
    "irrev_http_request_seconds",
    "HTTP request durations by route template",
    ["method", "route"],
    buckets=LATENCY_BUCKETS,
)
# The least over the live workers: 0 while any worker's feed is down (it then reads
# the policy store every refresh, and hears no announcement).
POLICY_FEED_LIVE = Gauge(
    "irrev_policy_feed_live",
    "1 while every worker is subscribed to the fleet's policy change announcements "
    "(pub/sub, PINGed every few seconds); 0 while one is not",
    multiprocess_mode="livemin",
)


def build_version() -> str:
    try:
        return version("irrev")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class PolicyState:
    """One worker's policies: tenant -> (version in force, applied at), and how many
    policy files of each tenant are on disk but not in force ("" for a file that
    names no tenant)."""

    versions: dict[str, tuple[str, float]] = field(default_factory=dict)
    failing: dict[str, int] = field(default_factory=dict)


def _gauge(
    name: str, doc: str, labels: list[str], rows: Iterable[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


class _Fleet:
    """The scrape-time gauges. `detailed`: also those whose labels name accounts or
    whose values are per tenant and do not add up (ages): only for callers who may
    see tenants."""

    def __init__(self, snapshots: list[TenantSnapshot], policies: PolicyState, detailed: bool):
        self.snapshots = snapshots
        self.policies = policies
        self.detailed = detailed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snaps = self.snapshots
        yield _gauge(
            "irrev_live_holds",
            "Live holds by state (from the ledger)",
            ["tenant", "state"],
            (([s.tenant, state], n) for s in snaps for state, n in sorted(s.counts.items())),
        )
        yield _gauge(
            "irrev_build_info",
            "The gateway's version",
            ["version", "python"],
            [([build_version(), platform.python_version()], 1)],
        )
        failing = dict.fromkeys(self.policies.versions, 0) | self.policies.failing
        yield _gauge(
            "irrev_policy_failing",
            "Policy files on disk that are not in force (their tenant keeps the policy it had)",
            ["tenant"],
            (([tenant], n) for tenant, n in sorted(failing.items())),
        )
        if not self.detailed:
            return
        yield from self._budgets()
        versions = sorted(self.policies.versions.items())
        yield _gauge(
            "irrev_policy_info",
            "The policy in force: its version is a digest of its file",
            ["tenant", "version"],
            (([tenant, v], 1) for tenant, (v, _) in versions),
        )
        yield _gauge(
            "irrev_policy_applied_timestamp_seconds",
            "When the policy in force was applied (Unix time)",
            ["tenant"],
            (([tenant], at) for tenant, (_, at) in versions),
        )
        yield from self._queues()

    def _budgets(self) -> Iterator[GaugeMetricFamily]:
        rows = [(s.tenant, b) for s in self.snapshots for b in s.balances]
        for part, doc in (
            ("limit", "Account limits"),
            ("pending", "Held on accounts by live holds"),
            ("posted", "Posted to accounts in their window"),
            ("available", "Left on accounts: limit - pending - posted (negative after an overrun)"),
        ):
            yield _gauge(
                f"irrev_budget_{part}_micros",
                f"{doc}, in the tenant's minor unit",
                ["tenant", "account"],
                (([tenant, b.account], getattr(b, part)) for tenant, b in rows),
            )

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        snaps = self.snapshots
        yield _gauge(
            "irrev_escalation_oldest_age_seconds",
            "Age of the oldest escalation waiting for a human (0: none)",
            ["tenant"],
            (([s.tenant], _oldest(s.now_ms, [t0 for t0, _ in s.escalated])) for s in snaps),
        )
        yield _gauge(
            "irrev_escalation_next_expiry_seconds",
            "Time left before the first waiting escalation expires (absent: none waits)",
            ["tenant"],
            (
                ([s.tenant], (min(dl for _, dl in s.escalated) - s.now_ms) / 1000)
                for s in snaps
                if s.escalated
            ),
        )
        yield _gauge(
            "irrev_ambiguous_oldest_age_seconds",
            "Age of the oldest ambiguous hold, charged until reconciled (0: none)",
            ["tenant"],
            (([s.tenant], _oldest(s.now_ms, s.ambiguous)) for s in snaps),
        )


def _oldest(now_ms: int, created: list[int]) -> float:
    return max(0, now_ms - min(created)) / 1000 if created else 0.0


class _WithoutNames:
    """Every family of `source` without its NAMING_LABELS: samples that differed only
    by them are summed (counts, sums, buckets and live holds all add up), so a caller
    who may not know the tenants, admins or tools still sees the fleet's totals."""

    def __init__(self, source: Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # a creation time per tenant: no sum of them means anything
                labels = tuple((k, v) for k, v in sample.labels.items() if k not in NAMING_LABELS)
                key = (sample.name, labels)
                summed[key] = summed.get(key, 0.0) + sample.value
            merged = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels), value in summed.items():
                merged.add_sample(name, dict(labels), value)
            yield merged


def exposition(
    snapshots: list[TenantSnapshot], policies: PolicyState, *, tenant_labels: bool
) -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        own: Collector = CollectorRegistry()
        multiprocess.MultiProcessCollector(own)
    else:
        from prometheus_client import REGISTRY

        own = REGISTRY
    fleet = CollectorRegistry()
    fleet.register(_Fleet(snapshots, policies, detailed=tenant_labels))
    if tenant_labels:
        return generate_latest(own) + generate_latest(fleet)
    return generate_latest(_WithoutNames(own)) + generate_latest(_WithoutNames(fleet))
