"""Gateway settings from `IRREV_*` environment variables (one prefix for all of irrev)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.state.policies import ForwardBudget
from gateway.state.supervision import Supervision
from gateway.state.webhooks import Pacing
from ledger import LedgerSettings

# A tenant member id's pattern (pricing/values.py MemberId).
OPERATOR_NAME = re.compile(r"[A-Za-z0-9._@/-]{1,100}")


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IRREV_", extra="ignore")

    policy_dir: Path = Field(default=Path("examples"), description="tenant policy YAML files")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    admin_tokens: str = Field(
        default="",
        description="comma-separated name=token pairs (a name: 1-100 of A-Za-z0-9._@/-); "
        "an operator's decisions are recorded as operator:<name>",
    )
    upstream_connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    upstream_timeout_s: float = Field(default=10.0, gt=0, le=300)
    upstream_max_connections: int = Field(
        default=200, ge=1, le=10_000, description="upstream connections per worker, all tenants"
    )
    upstream_tenant_connections: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="requests one tenant may have in flight to its HTTP upstreams per worker "
        "(0: a quarter of upstream_max_connections; set below it, or one tenant can take "
        "every connection): its stuck upstream cannot starve the others; one that finds "
        "no slot within upstream_connect_timeout_s is not sent",
    )

    def tenant_connections(self) -> int:
        """The per-tenant bound in force: never above the pool, never below 1."""
        bound = self.upstream_tenant_connections or self.upstream_max_connections // 4
        return max(1, min(bound, self.upstream_max_connections))

    max_body_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=16 << 20,
        description="the largest request body on any route (413 body_too_large), checked "
        "before authentication; policy uploads have max_policy_bytes",
    )
    max_policy_bytes: int = Field(
        default=4 << 20,
        ge=1024,
        le=64 << 20,
        description="the largest policy document PUT /v1/admin/tenants/{tenant}/policy takes",
    )
    body_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="a request body (any route) must arrive whole within this long, else "
        "408 body_timeout: a client trickling its body cannot hold a worker",
    )
    forward_margin_s: float = Field(
        default=5.0, ge=0, description="never forward a hold this close to its deadline"
    )
    sweep_interval_s: float = Field(default=1.0, gt=0, le=3600)
    account_close_interval_s: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="how often each tenant's risk-factor accounts are scanned for idle ones "
        "(nothing pending or posted since their window ended), which are closed",
    )
    archive_after_s: float | Literal["auto", "off"] = Field(
        default="auto",
        description="settled holds older than this (seconds) leave the tenant's Redis slot "
        "for archived copies in other slots (ledger/archive.py), so that a slot migration "
        "moves live holds only; 'auto' is 60 on a Redis Cluster and off on a standalone "
        "Redis (which has no slot to move)",
    )
    policy_check_interval_s: float = Field(
        default=2.0, gt=0, description="how often a worker looks for changed policy files"
    )
    policy_poll_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="how often the fleet's watcher (one worker of the fleet; each worker "
        "while none beats) reads the policy store's epochs though no change was announced "
        "(pub/sub), and announces any that moved: the bound on a change whose announcement "
        "was lost without the subscription dropping; a dropped one is re-read at once",
    )
    policy_full_read_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="how often the fleet's watcher reads the version of every tenant's "
        "stored policy, and bumps the epoch when one moved (each worker, while no watcher "
        "beats, reads the record of every tenant it serves): the bound on a write whose "
        "epoch bump was lost (its writer died before the INCR)",
    )
    keys_used_flush_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="how often a worker writes when each managed key was last used (one "
        "batch; never a write per request)",
    )
    retention_s: int = Field(default=7 * 24 * 3600, ge=60)
    denied_retention_s: int = Field(
        default=600,
        ge=1,
        description="how long a denied request's record is kept, to answer a retry of its "
        "key with the same refusal (at most retention_s); later the request is decided again",
    )
    metrics_tenant_labels: bool = Field(
        default=False,
        description="show tenant labels on /metrics to any caller; otherwise only to an "
        "admin token, and others get every series summed over tenants",
    )
    metrics_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="how long a worker answers /metrics scrapes by anyone but an operator "
        "with the fleet gauges it last read for such a scrape (with tenant labels they read "
        "every waiting hold); an operator's scrape always reads them",
    )
    metrics_agent_accounts: bool = Field(
        default=False,
        description="report the budget gauges of every agent's account too (one series per "
        "agent); otherwise the tenant's, its principals' and its named risk factors'",
    )
    refusals_flush_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="how often a worker adds the refusals it counted to the fleet's counts "
        "in Redis (GET /v1/admin/tenants/{t}/refusals): one round trip for all tenants, "
        "never one per refusal; a refusal shows that much later at most",
    )
    wait_replicas: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Redis replicas that must acknowledge an admission (WAIT) before its "
        "effect is forwarded; fewer within wait_timeout_ms: released, 503 not_replicated. "
        "Posts and true-ups wait too and are kept whatever the count (logged, counted: "
        "irrev_unacknowledged_writes_total); the holds API answers a short one 503 "
        "not_replicated, to be repeated",
    )
    wait_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    migration_wait_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="how long a ledger call waits out its tenant's Redis Cluster slot moving "
        "to another node (TRYAGAIN) before it fails closed: 503 ledger_migrating, nothing "
        "written",
    )
    group_wait_ms: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="group commit: a tenant's concurrent reserves, and its concurrent "
        "posts, go to Redis as one script call each, a call waiting at most this long for "
        "others to join it (one with none beside it goes at once); each keeps its own "
        "decision and idempotency. 0 (the default) sends each alone: measured, a group "
        "saves the gateway's client work but not Redis's (docs/performance.md)",
    )
    wait_aof: Literal["off", "local", "all"] = Field(
        default="off",
        description="WAITAOF (Redis 7.2+, Valkey) on every write that must be kept "
        "(admission, approval, post, true-up, account change): 'local' waits for the "
        "primary's fsync of its append-only file too (then WAIT for wait_replicas: up to "
        "twice wait_timeout_ms), 'all' also counts only replicas that fsynced it toward "
        "wait_replicas (about a second a write: they report fsyncs once a second). Short: "
        "admissions, approvals and account changes are refused (released, 503 not_fsynced "
        "or not_replicated); posts and true-ups are kept anyway, logged and counted "
        "(irrev_unacknowledged_writes_total): the holds API answers 503 not_fsynced, to "
        "be repeated, the gateway's own post after a forward is acknowledged, so one in "
        "the window can be lost. A server "
        "without WAITAOF, AOF or fsyncs, a user denied it, or replicas that do not fsync "
        "('all') refuse the start (a probe write)",
    )
    durability: Literal["warn", "require"] = Field(
        default="warn",
        description="at start, the Redis persistence settings are read and logged; one "
        "that can lose an acknowledged write (AOF off, appendfsync no, unreadable) with "
        "IRREV_WAIT_REPLICAS 0 is a warning, or with 'require' a refusal to start",
    )
    journal_keep_s: int = Field(
        default=7 * 24 * 3600,
        ge=0,
        description="journal entries older than this are archived to JSON lines and trimmed "
        "from Redis behind a checkpoint; 0 keeps every entry in Redis",
    )
    journal_archive_dir: Path | None = Field(
        default=None, description="where trimmed journal entries go; unset: <data dir>/journal"
    )
    journal_trim_interval_s: float = Field(default=300.0, gt=0, le=86_400)
    instance: str = Field(
        default="",
        description="this gateway's name in the fleet (irrev serve sets host name, address "
        "and port): its workers' sweep leases carry it, and it alone reports the fleet "
        "gauges of the tenants it sweeps",
    )
    webhook_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="how long a webhook receiver has to answer, its whole answer",
    )
    webhook_backoff_s: float = Field(
        default=0.5, gt=0, le=60, description="the first retry's delay; each doubles it"
    )
    webhook_backoff_max_s: float = Field(default=60.0, gt=0, le=3600)
    webhook_lease_s: float = Field(
        default=15.0,
        gt=0,
        le=600,
        description="how long a dispatcher's claim on a tenant's webhook lasts unless renewed "
        "(at least 3 x webhook_timeout_s)",
    )
    webhook_poll_s: float = Field(
        default=0.5, gt=0, le=60, description="how often an idle tenant's journal is looked at"
    )
    mcp_restarts: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="restarts of a stdio MCP server (tools.<name>.mcp_command) a worker makes "
        "within mcp_restart_window_s; after them the server stays down (its calls refused "
        "at once, upstream_unreachable) until the oldest restart leaves the window",
    )
    mcp_restart_window_s: float = Field(default=60.0, gt=0, le=86_400)
    mcp_restart_backoff_s: float = Field(
        default=0.5,
        gt=0,
        le=600,
        description="the wait before a stdio MCP server's first restart; each further one "
        "within the window waits twice the one before, at most mcp_restart_backoff_max_s",
    )
    mcp_restart_backoff_max_s: float = Field(default=10.0, gt=0, le=3600)
    mcp_start_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="how long a stdio MCP server has from its start to the end of the MCP "
        "handshake; longer counts as a failed start",
    )
    log_level: str = "info"

    @field_validator("admin_tokens")
    @classmethod
    def _admin_tokens(cls, value: str) -> str:
        for entry in filter(None, (e.strip() for e in value.split(","))):
            name, sep, token = entry.partition("=")
            if not sep or not name or len(token) < 16:
                raise ValueError(
                    "each entry must be name=token with a token of at least 16 characters"
                )
            if not OPERATOR_NAME.fullmatch(name):
                # Recorded as `operator:<name>` (gateway/edge/auth.py) in the journal, which
                # refuses an id past 128 characters or outside this set, after the
                # decision it records was made.
                raise ValueError(
                    f"an operator's name is 1-100 characters of A-Z a-z 0-9 . _ @ / -, not {name!r}"
                )
        return value

    def admins(self) -> dict[str, str]:
        """token -> admin name."""
        pairs = (e.strip().partition("=") for e in self.admin_tokens.split(",") if e.strip())
        return {token: name for name, _, token in pairs}

    def forward_budget(self) -> ForwardBudget:
        return ForwardBudget(self.upstream_timeout_s, self.forward_margin_s)

    def mcp_supervision(self) -> Supervision:
        return Supervision(
            max_restarts=self.mcp_restarts,
            window_s=self.mcp_restart_window_s,
            backoff_s=self.mcp_restart_backoff_s,
            backoff_max_s=self.mcp_restart_backoff_max_s,
            start_timeout_s=self.mcp_start_timeout_s,
        )

    @property
    def ledger(self) -> LedgerSettings:
        return LedgerSettings()

    def webhook_pacing(self) -> Pacing:
        return Pacing(
            self.webhook_timeout_s,
            self.webhook_backoff_s,
            self.webhook_backoff_max_s,
            self.webhook_lease_s,
            self.webhook_poll_s,
        )

    def archive_dir(self) -> Path:
        return self.journal_archive_dir or self.ledger.data_dir / "journal"
