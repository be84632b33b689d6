"""A tenant's policy document: what the YAML says (pydantic v2), and nothing compiled.

Accounts, agents, tools and the trusted route catalog as the operator wrote them.
Amounts are written in major units (`"250000"`, `14.80`) and held as `int` minor
units: they are converted exactly with the document's own `risk_unit.scale`, which
reaches the field validators as validation context. Build policies with
`pricing.load_policy_text` / `load_policy_data`, which also run the cross-field checks
and compile the document into the serving view the gateway prices with
(`pricing.serving.TenantPolicy`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from pricing.headers import HeaderName
from pricing.models import PricingSpec
from pricing.suspension import Suspension
from pricing.values import (
    DurationMs,
    DurationOrZeroMs,
    FactorPattern,
    FieldName,
    MemberId,
    Micros,
    Scale,
    SoftBand,
    TenantId,
    TokenHash,
    ToolName,
    UpstreamUrl,
)


class EffectClass(StrEnum):
    """What compensation can do about an effect; taken from the catalog, never the agent."""

    READ = "read"
    REVERSIBLE = "reversible"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


class BodyFormat(StrEnum):
    """How a route's request body is encoded; the other format is refused."""

    JSON = "json"
    FORM = "form"


class McpErrorMeaning(StrEnum):
    """What an MCP tool result with `isError: true` says about the effect."""

    AMBIGUOUS = "ambiguous"  # it may have happened: the hold stays charged
    NOT_EXECUTED = "not_executed"  # the tool refused before acting: the hold is voided


# An agent's escalations waiting at once, by default: room for a busy agent's real
# approvals, far from the thousands a looping one made (issue 26).
MAX_ESCALATIONS = 20


class Keyless(StrEnum):
    """What becomes of an effect whose caller sent no idempotency key."""

    # Keyed by its content (agent, route, the request as priced): a repeat while the
    # first is live, or settled within the route's dedupe_window, is the same effect.
    CONTENT = "content"
    REFUSE = "refuse"  # 400 idempotency_key_required


class Mode(StrEnum):
    """Whether the gateway acts on its decisions."""

    ENFORCE = "enforce"
    # Priced, held and journaled as usual, never blocking: a deny or an escalation is
    # recorded and the effect forwarded anyway (docs/policy.md, "Shadow mode").
    SHADOW = "shadow"


class UnknownRouteAction(StrEnum):
    DENY = "deny"
    PRICE_AS_IRREVERSIBLE = "price_as_irreversible"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RiskUnit(_Model):
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,16}$")]
    scale: Scale = Field(
        description="minor units per major unit, a power of ten (10**6: micro-USD)"
    )


class Rate(_Model):
    """Requests a second, and how many may come at once."""

    per_second: Annotated[float, Field(gt=0, le=1000)]
    burst: Annotated[int, Field(strict=True, ge=1, le=100_000)] = 1


class RateLimits(_Model):
    """An agent's or a principal's request rates (all of a principal's agents share
    its); checked in Redis, fleet-wide (docs/policy.md, "Rate limits")."""

    effects: Rate | None = Field(
        default=None, description="effects, checked in the reserve's own Redis call"
    )
    reads: Rate | None = Field(default=None, description="reads, in one Redis call each")


class AccountLimits(_Model):
    limit: Micros
    soft_band: SoftBand | None = None
    approval_threshold: Micros | None = None


RouteScope = Annotated[str, StringConstraints(min_length=3, max_length=2100)]
ScopeList = Annotated[list[RouteScope], Field(max_length=1000)]
SCOPE_DESCRIPTION = (
    "the only routes allowed, as '<tool> <METHOD> <path template>' or '<tool> *' "
    "(unset: every route; an empty list: none)"
)


class PrincipalLimits(AccountLimits):
    """A principal's account, and the routes its agents may use (with the agents' own)."""

    routes: ScopeList | None = Field(default=None, description=SCOPE_DESCRIPTION)
    rate_limits: RateLimits | None = Field(
        default=None, description="request rates all of the principal's agents share"
    )


class FactorLimits(AccountLimits):
    """A risk-factor pattern's accounts, and what its ids are."""

    ids: Literal["any", "integer"] = Field(
        default="any",
        description=(
            "'integer': the tool API reads these ids as numbers, so a value must be one "
            "(42, 042 and 4.2e1 are one account already; '42abc', '4_2' or '42-x', "
            "which such an API may read as 42, are refused rather than given accounts "
            "of their own)"
        ),
    )


class Accounts(_Model):
    tenant: AccountLimits
    principals: Annotated[dict[MemberId, PrincipalLimits], Field(min_length=1)]
    risk_factors: dict[FactorPattern, FactorLimits] = Field(default_factory=dict)


EscalationCount = Annotated[int, Field(strict=True, ge=1, le=100_000)]


class Agent(_Model):
    """A credential acting for exactly one principal, with its local caps."""

    principal: MemberId
    token_sha256: TokenHash | None = Field(
        default=None,
        description="sha256:<hex> of the agent's bearer token; omit it for an agent whose "
        "credentials are managed keys only ('irrev keys create')",
    )
    per_effect_cap: Micros = Field(description="largest face value of one effect")
    window_cap: Micros = Field(description="the agent account's limit per window")
    soft_band: SoftBand | None = None
    approval_threshold: Micros | None = None
    routes: ScopeList | None = Field(default=None, description=SCOPE_DESCRIPTION)
    max_escalations: EscalationCount | None = Field(
        default=None,
        description="how many of this agent's effects may wait for a human at once "
        "(default: the tenant's max_escalations)",
    )
    max_new_accounts: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] | None = Field(
        default=None,
        description="risk-factor accounts this agent's effects may open per window "
        "(default: the tenant's max_new_accounts)",
    )
    rate_limits: RateLimits | None = Field(
        default=None, description="the agent's request rates, for effects and for reads"
    )
    suspended: Suspension | None = Field(
        default=None,
        description="set: an operator stopped the agent (why, by whom, when) and every "
        "call of it is refused, agent_suspended; absent: active",
    )


class AdminRole(StrEnum):
    """What a tenant's admin may do, each role including the ones before it."""

    VIEWER = "viewer"  # read the tenant's admin endpoints
    APPROVER = "approver"  # + approve or reject escalations, reconcile
    POLICY_ADMIN = "policy_admin"  # + upload the tenant's policy, reload policies

    def includes(self, other: AdminRole) -> bool:
        order = list(AdminRole)
        return order.index(self) >= order.index(other)


class TenantAdmin(_Model):
    """A person or tool administering this tenant only (operators use IRREV_ADMIN_TOKENS)."""

    token_sha256: TokenHash
    role: AdminRole


EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
InProgressStatus = Annotated[int, Field(strict=True, ge=400, le=499)]
AbsolutePath = Annotated[str, StringConstraints(pattern=r"^/[^\x00]{0,1023}$")]


class SecretSource(_Model):
    """Where a secret comes from: an environment variable or a file, read by the
    gateway at load; never in the policy."""

    env: EnvName | None = None
    file: AbsolutePath | None = None

    @property
    def source(self) -> str:
        return f"environment variable {self.env!r}" if self.env else f"file {self.file!r}"


# One argument of a command: any text but NUL, which an argv cannot carry.
CommandArg = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")]
# A literal environment value (visible to whoever reads the policy) or a secret.
EnvValue = Annotated[str, StringConstraints(max_length=4096, pattern=r"^[^\x00]*$")] | SecretSource


class HeaderSecret(SecretSource):
    """The value of a header the gateway adds to a tool's requests."""

    prefix: Annotated[str, StringConstraints(pattern=r"^[\x20-\x7e]{0,64}$")] = Field(
        default="", description="put before the value, e.g. 'Bearer '"
    )


# An agent's allowance of kept answer bytes per UTC day: 64 answers of the largest
# kept body (256 KiB), or thousands of typical JSON answers of a few KB; a flooding
# agent then adds at most 16 MiB a day for the 7 days answers are kept.
KEPT_ANSWER_BYTES = 16 << 20


class RequestLimits(_Model):
    """What one request, and one agent at a time, may cost the gateway before anything
    is priced (checked on the bytes or while parsing, so that refusing a request costs
    less than the request), and its answers kept in Redis (docs/policy.md)."""

    max_body_bytes: Annotated[int, Field(strict=True, ge=1024, le=16 << 20)] = Field(
        default=256 * 1024,
        description="the largest body of an agent's request (within the gateway's "
        "IRREV_MAX_BODY_BYTES): a larger Content-Length is refused before it is read",
    )
    max_values: Annotated[int, Field(strict=True, ge=16, le=1_000_000)] = Field(
        default=10_000,
        description="JSON: object keys, values and array items in one body; form: fields",
    )
    max_string_length: Annotated[int, Field(strict=True, ge=64, le=16 << 20)] = Field(
        default=64 * 1024, description="the longest string (JSON) or field value (form)"
    )
    max_in_flight: Annotated[int, Field(strict=True, ge=1, le=10_000)] = Field(
        default=16,
        description="requests of one agent in flight at once in one gateway worker",
    )
    kept_answer_bytes: Annotated[int, Field(strict=True, ge=0, le=1 << 40)] = Field(
        default=KEPT_ANSWER_BYTES,
        description="bytes of tool answers kept whole for one agent's repeats per UTC "
        "day; past it an answer is kept without its body (status, headers, its length "
        "and SHA-256), and a repeat says so. 0 keeps no body",
    )


class Webhook(_Model):
    """Where the approval loop's events go: each POSTed as JSON, signed with HMAC-SHA256
    under `secret` (header Irrev-Signature), retried until it is taken."""

    url: UpstreamUrl = Field(
        description="the receiver's URL, e.g. 'https://hooks.example.com/irrev'"
    )
    secret: SecretSource = Field(description="the signing secret: {env: NAME} or {file: /path}")


# What only an operator (IRREV_ADMIN_TOKENS) may set, in a tool and in the document: a
# tenant admin's upload that changes any is refused whole
# (gateway/routes/admin_policies.py). Where a tool's requests go and the secrets they
# carry (an admin could point the tenant's credentials, or any variable or file the
# gateway can read, at a host of its own), and which command a stdio MCP server runs
# on the gateway's hosts; who settles its holds
# (a settler posts, voids and trues them up); whether irrev may send an ambiguous call
# again (to a server that does not deduplicate, every repeat is another effect for one
# charge); where the tenant's signed events go.
OPERATOR_TOOL_FIELDS = (
    "upstream",
    "mcp",
    "mcp_command",
    "mcp_env",
    "mcp_cwd",
    "dedupes",
    "credentials",
    "settler_token_sha256",
)
OPERATOR_FIELDS = ("webhook",)


class Tool(_Model):
    upstream: UpstreamUrl | None = None
    mcp: UpstreamUrl | None = Field(
        default=None,
        description="the Streamable HTTP endpoint of an MCP server (e.g. "
        "'http://127.0.0.1:8900/mcp'); its routes are 'CALL <tool>/<mcp tool>'",
    )
    mcp_command: Annotated[list[CommandArg], Field(min_length=1, max_length=64)] | None = Field(
        default=None,
        description="instead of mcp: the command (an argv list, no shell) of a stdio MCP "
        "server that each gateway worker runs and restarts, e.g. ['npx', '-y', "
        "'@modelcontextprotocol/server-github']; its routes are 'CALL <tool>/<mcp tool>'",
    )
    mcp_env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="mcp_command only: the server's environment beyond HOME, LOGNAME, PATH, "
        "SHELL, TERM and USER: a literal value, or a secret {env: NAME} or {file: /path} "
        "read by the gateway (never the agent's)",
    )
    mcp_cwd: AbsolutePath | None = Field(
        default=None,
        description="mcp_command only: the server's working directory (default: the gateway's)",
    )
    dedupes: bool = Field(
        default=False,
        description="MCP servers only: the server makes at most one effect per "
        "_meta['dev.irrev/idempotency_key'], so irrev may send a repeat of an ambiguous "
        "call again; false (the default): a repeat answers from the ledger only",
    )
    credentials: dict[HeaderName, HeaderSecret] = Field(
        default_factory=dict, description="headers the gateway adds to every upstream request"
    )
    forward_headers: list[HeaderName] = Field(
        default_factory=list, description="agents' request headers passed on, beyond the defaults"
    )
    response_headers: list[HeaderName] = Field(
        default_factory=list, description="upstream answer headers passed back, beyond the defaults"
    )
    in_progress_statuses: list[InProgressStatus] = Field(
        default_factory=lambda: [409],
        description="answers that mean 'this Idempotency-Key is still being processed'",
    )
    settler_token_sha256: TokenHash | None = Field(
        default=None,
        description="hash of the tool API's own settler credential: it may settle (post, "
        "void, compensate, true up) the holds of this tool's routes; agents never hold it",
    )

    @property
    def is_mcp(self) -> bool:
        """An MCP server, over Streamable HTTP (`mcp`) or stdio (`mcp_command`)."""
        return self.mcp is not None or self.mcp_command is not None


class Stress(_Model):
    """A route's stress detector (pricing/stress.py): Page's CUSUM over the route's
    requests across the fleet, kept in the tenant's ledger and shared by every
    gateway. While it is on, the route's effects are priced at `loss_factor` of their
    face value (never below their calm price)."""

    calm_rate: float = Field(
        gt=0,
        le=1e6,
        description="requests per second the route's whole fleet sends in calm: the "
        "warm-up the detector's own estimate starts from",
    )
    warm_up_ms: DurationMs = Field(
        default=600_000,
        alias="warm_up",
        description="how much calm history calm_rate counts for (default 10m): the "
        "estimate is (calm_rate x warm_up + requests seen while off) / (warm_up + time "
        "seen while off)",
    )
    tick_ms: DurationMs = Field(
        default=1000, alias="tick", description="the detector's clock tick (default 1s)"
    )
    shift: float = Field(
        default=2.0,
        gt=1,
        le=1000,
        description="the rise it looks for, x the calm rate (default 2); it drifts up at "
        "any rate above (shift - 1) / ln(shift) x calm (1.44x for 2)",
    )
    threshold: float = Field(
        default=4.0, gt=0, le=1000, description="the score at which it trips (default 4)"
    )
    hold_ms: DurationMs = Field(
        default=60_000, alias="hold", description="how long it stays on after it trips (1m)"
    )
    loss_factor: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="the price while on, x the face value (default 1: the face value)",
    )

    @property
    def hold_ticks(self) -> int:
        return self.hold_ms // self.tick_ms

    @property
    def warm_ticks(self) -> float:
        return self.warm_up_ms / self.tick_ms

    @property
    def warm_requests(self) -> float:
        """The requests calm_rate expects over the warm-up."""
        return self.calm_rate * self.warm_up_ms / 1000


class Route(_Model):
    tool: ToolName
    route: str = Field(description="'METHOD /path/{param}' under the tool's proxy prefix")
    effect_class: EffectClass = Field(
        alias="class", description="what compensation can do about the route's effects"
    )
    body: list[FieldName] = Field(
        default_factory=list, description="body fields the route's pricing reads"
    )
    query: list[FieldName] = Field(
        default_factory=list, description="query parameters the route takes (others are refused)"
    )
    face_value: str | None = Field(
        default=None, description="request fields whose product is the face value, e.g. 'a * b'"
    )
    face_value_fixed: Micros | None = Field(
        default=None, description="a face value that does not depend on the request"
    )
    risk_factors: list[str] = Field(
        default_factory=list,
        description="factor templates such as 'supplier:{supplier_id}', each capped by an "
        "accounts.risk_factors entry",
    )
    pricing: PricingSpec | None = Field(
        default=None, description="the pricing model (default: face, the whole face value)"
    )
    approval_threshold: Micros | None = Field(
        default=None, description="a single price above it escalates to a human"
    )
    lookup: str | None = Field(
        default=None,
        description="'GET /path?key={key}': how the gateway asks the tool about an effect "
        "whose answer it did not see",
    )
    in_process: Annotated[bool, Field(strict=True)] = Field(
        default=False, description="decision-only: agents ask /v1/holds and call the tool"
    )
    overrun_report: Annotated[bool, Field(strict=True)] = Field(
        default=False,
        description="an agent may post one of its in-process holds above its price "
        "(never above the face value)",
    )
    body_format: BodyFormat = BodyFormat.JSON
    amount_scale: Scale | None = Field(
        default=None,
        description="face-value fields hold 1/amount_scale major units (100: cents); "
        "integers required",
    )
    currency_field: FieldName | None = Field(
        default=None, description="a field that must name the tenant's risk-unit currency"
    )
    mode: Mode | None = Field(
        default=None, description="'enforce' or 'shadow' for this route (default: the tenant's)"
    )
    is_error: McpErrorMeaning | None = Field(
        default=None,
        description="CALL routes only: what an MCP result with isError means; default "
        "'ambiguous' (still charged), 'not_executed' voids the hold",
    )
    keyless: Keyless | None = Field(
        default=None,
        description="a call without an idempotency key: 'content' keys it by the agent, "
        "the route and the request as priced, so that a repeat is the same effect; "
        "'refuse' answers 400. Default: 'content' for CALL routes (MCP hosts send no "
        "key), 'refuse' for HTTP routes",
    )
    dedupe_window_ms: DurationOrZeroMs | None = Field(
        default=None,
        alias="dedupe_window",
        description="keyless calls: how long after its effect settled an identical call "
        "is still answered as a repeat of it (default 10m); 0: every keyless call is a "
        "new effect (for routes whose identical calls are meant to repeat)",
    )
    stress: Stress | None = Field(
        default=None,
        description="a stress detector: a burst of the route's requests across the fleet "
        "prices its effects stressed (docs/policy.md, stress)",
    )
    escalation_wait_ms: DurationOrZeroMs | None = Field(
        default=None,
        alias="escalation_wait",
        description="CALL routes: how long a tools/call that escalates waits for the human's "
        "decision before answering that it is pending (default 20s; 0: at once); a call "
        "that sends its own _meta key and no progress token is answered at once",
    )


class UnknownRoutes(_Model):
    action: UnknownRouteAction = UnknownRouteAction.DENY
    face_value: str | None = Field(
        default=None, description="body fields whose product is the face value"
    )
    approval_threshold: Micros | None = None


def _unknown_routes(value: object) -> object:
    return {"action": value} if isinstance(value, str) else value


class PolicyDocument(_Model):
    """One tenant's policy file as written; `pricing.serving.compile_policy` turns it
    into what requests are priced with."""

    tenant: TenantId = Field(description="the tenant id; its ledger keys carry it")
    risk_unit: RiskUnit = Field(description="the currency and minor units every amount is in")
    window_ms: DurationMs = Field(alias="window", description="budget window, aligned to UTC")
    soft_band: SoftBand = Field(
        default=0.8, description="fraction of a limit above which holds escalate to a human"
    )
    mode: Mode = Field(
        default=Mode.ENFORCE,
        description="'enforce', or 'shadow': never block; record what enforcement would do",
    )
    escalation_ttl_ms: DurationMs = Field(
        alias="escalation_ttl",
        description="how long an escalated hold waits for a human before it expires",
    )
    hold_ttl_ms: DurationMs = Field(
        alias="hold_ttl", description="how long an admitted hold may stay pending"
    )
    min_amount: Micros | None = Field(
        default=None,
        description="the smallest face value an effect may have above zero; a smaller "
        "one (a micro-payment that would open a risk-factor account for next to nothing) "
        "is refused bad_amount. Default: a hundredth of the major unit (one minor unit "
        "where the scale is below 100)",
    )
    max_new_accounts: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] = Field(
        default=1000,
        description="how many risk-factor accounts one agent's effects may open per window "
        "(account_cap past it); idle ones close once their window is over",
    )
    request_limits: RequestLimits = Field(
        default_factory=RequestLimits,
        description="what one request and one agent at a time may cost the gateway",
    )
    max_escalations: EscalationCount = Field(
        default=MAX_ESCALATIONS,
        description="how many of one agent's effects may wait for a human at once; one "
        "more is refused (escalation_cap), so no agent can bury the approval queue",
    )
    unknown_routes: Annotated[
        UnknownRoutes,
        BeforeValidator(_unknown_routes, json_schema_input_type=UnknownRouteAction | UnknownRoutes),
    ] = Field(
        default_factory=UnknownRoutes,
        description="'deny' (the default), or how to price a route the catalog does not list",
    )
    accounts: Accounts = Field(description="the tenant's, principals' and risk factors' limits")
    agents: dict[MemberId, Agent] = Field(
        default_factory=dict, description="agent credentials, each acting for one principal"
    )
    admins: dict[MemberId, TenantAdmin] = Field(
        default_factory=dict, description="the tenant's own admins and their roles"
    )
    tools: dict[ToolName, Tool] = Field(
        default_factory=dict, description="the tool APIs the gateway forwards to"
    )
    routes: list[Route] = Field(
        default_factory=list, description="the trusted route catalog: class and price per route"
    )
    webhook: Webhook | None = Field(
        default=None,
        description="where escalated, approved, rejected, expired, ambiguous and resolved "
        "holds are announced (docs/policy.md, 'Webhooks')",
    )
    kind: Literal["policy"] = "policy"

    @property
    def scale(self) -> int:
        return self.risk_unit.scale
