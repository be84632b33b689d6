"""Reading tenant policies from disk: one YAML file per tenant in a directory.

pricing/ parses and checks policy text without I/O; this module is the file edge.
Files whose top-level `kind` is `demo-tokens` hold plaintext demo credentials (see
examples/procurement.tokens.yaml) and are never loaded as policies.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ledger import MAX_ID_CHARS, AccountSpec, BadInput, Pace, check_account_spec
from pricing import (
    FACTOR_PREFIX,
    AuthenticatedAgent,
    Finding,
    PolicyAccount,
    PolicyError,
    Rate,
    TenantPolicy,
    agent_for_token_hash,
    hash_token,
    load_policy_data,
    merge_documents,
    parse_yaml,
    policy_accounts,
)

DEMO_TOKENS_KIND = "demo-tokens"
POLICY_SUFFIXES = (".yaml", ".yml")


class PolicyLoadError(Exception):
    """One or more policy files are wrong; `errors` holds each file's PolicyError."""

    def __init__(self, errors: list[PolicyError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass(frozen=True, slots=True)
class DemoTokens:
    """Plaintext tokens of a demo policy's agents. Demo only: never for real tenants."""

    tenant: str
    policy: Path
    tokens: dict[str, str]
    settlers: dict[str, str] = field(default_factory=dict)  # tool -> its settler's token
    admins: dict[str, str] = field(default_factory=dict)  # tenant admin id -> token


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(str(path), [Finding("", f"cannot read file: {exc}")]) from exc


def is_demo_tokens(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == DEMO_TOKENS_KIND


def read_policy_file(path: Path) -> TenantPolicy:
    source = str(path)
    data = parse_yaml(read_text(path), source)
    if is_demo_tokens(data):
        raise PolicyError(source, [Finding("kind", "this is a demo token file, not a policy")])
    return load_policy_data(data, source)


@dataclass(frozen=True, slots=True)
class ForwardBudget:
    """What a hold must outlive to be forwarded (settings, not policy): fire() refuses
    to send once fewer than `upstream_timeout_s` are left before the hold's deadline
    minus `forward_margin_s`; 1 s more covers the time from the reserve or approval
    that set the deadline (Redis's clock) to the forward. A hold_ttl below their sum
    refuses every effect."""

    upstream_timeout_s: float = 0.0
    forward_margin_s: float = 0.0

    @property
    def min_hold_ttl_ms(self) -> int:
        return math.ceil((self.upstream_timeout_s + self.forward_margin_s + 1) * 1000)

    def findings(self, policy: TenantPolicy) -> list[Finding]:
        if policy.hold_ttl_ms >= self.min_hold_ttl_ms:
            return []
        detail = (
            f"{policy.hold_ttl_ms / 1000:g} s leaves no room to forward an effect: it must be "
            f"at least {self.min_hold_ttl_ms / 1000:g} s (IRREV_UPSTREAM_TIMEOUT_S "
            f"{self.upstream_timeout_s:g} s + IRREV_FORWARD_MARGIN_S "
            f"{self.forward_margin_s:g} s + 1 s), or every effect is refused 503 hold_deadline"
        )
        return [Finding("hold_ttl", detail)]


# For callers without settings (pure policy checks): no hold TTL is too short.
NO_BUDGET = ForwardBudget()


def check_policy_set(
    policies: Iterable[tuple[str, TenantPolicy]], budget: ForwardBudget = NO_BUDGET
) -> list[PolicyError]:
    """Faults across files (a tenant defined twice, or one token valid for two agents,
    admins or tools)
    and against the settings in force (a hold TTL shorter than `budget`)."""
    errors: list[PolicyError] = []
    tenants: dict[str, str] = {}
    owners: dict[str, str] = {}
    for source, policy in policies:
        findings: list[Finding] = budget.findings(policy)
        if policy.tenant in tenants:
            findings.append(
                Finding(
                    "tenant",
                    f"{policy.tenant!r} is also defined in {tenants[policy.tenant]}",
                )
            )
        tenants.setdefault(policy.tenant, source)
        doc = policy.document
        members = [
            (f"agents.{a}", spec.token_sha256)
            for a, spec in doc.agents.items()
            if spec.token_sha256 is not None
        ]
        members += [(f"admins.{a}", spec.token_sha256) for a, spec in doc.admins.items()]
        for where, token_hash in members:
            if token_hash in owners:
                findings.append(
                    Finding(
                        f"{where}.token_sha256",
                        f"the same token is already used in {owners[token_hash]}; a "
                        "token must identify one tenant's agent or admin",
                    )
                )
            owners.setdefault(token_hash, source)
        for name, tool in policy.document.tools.items():
            if tool.settler_token_sha256 is None:
                continue
            if tool.settler_token_sha256 in owners:
                findings.append(
                    Finding(
                        f"tools.{name}.settler_token_sha256",
                        f"the same token is already used in {owners[tool.settler_token_sha256]}"
                        "; a token must identify one tenant's agent or tool",
                    )
                )
            owners.setdefault(tool.settler_token_sha256, source)
        if findings:
            errors.append(PolicyError(source, findings))
    return errors


def ledger_account(spec: PolicyAccount) -> AccountSpec:
    return AccountSpec(
        account=spec.account_id,
        limit=spec.limit_micros,
        soft_limit=spec.soft_limit_micros,
        window_ms=spec.window_ms,
        approval_threshold=spec.approval_threshold_micros or 0,
        max_escalations=spec.max_escalations,
        max_new_accounts=spec.max_new_accounts,
        effect_pace=pace(spec.rates.effects if spec.rates else None),
        read_pace=pace(spec.rates.reads if spec.rates else None),
    )


def pace(rate: Rate | None) -> Pace | None:
    return Pace.of(rate.per_second, rate.burst) if rate is not None else None


def ledger_errors(source: str, policy: TenantPolicy) -> list[PolicyError]:
    """ledger_findings as the error of `source`, or none. Checked once per policy where
    it enters (an upload, a file, a stored version), not in check_policy_set, which a
    reload runs once per file over all the others (with 60 tenants that took half a
    second of a worker's event loop)."""
    findings = ledger_findings(policy)
    return [PolicyError(source, findings)] if findings else []


def ledger_findings(policy: TenantPolicy) -> list[Finding]:
    """What the ledger would refuse of the accounts the policy opens, found before
    anything is written: a refusal half way through applying it left the store with
    the new version and some of its limits live, and every host's reload failing."""
    findings = []
    for spec in policy_accounts(policy):
        try:
            check_account_spec(ledger_account(spec))
        except BadInput as exc:
            findings.append(Finding("accounts", f"{spec.account_id}: {exc}"))
    for pattern in policy.document.accounts.risk_factors:
        # A wildcard's accounts are its prefix and at least one character more.
        if pattern.endswith("*") and len(FACTOR_PREFIX + pattern) > MAX_ID_CHARS:
            findings.append(
                Finding(
                    f"accounts.risk_factors.{pattern}",
                    f"too long: its accounts ({FACTOR_PREFIX}{pattern[:-1]}...) would be "
                    f"over the ledger's {MAX_ID_CHARS} characters",
                )
            )
    return findings


def policy_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in POLICY_SUFFIXES and p.is_file())


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """One file's policy as written, its version (a digest of the file's text, which
    names the policy in force on /metrics and in log lines) and its text."""

    path: Path
    policy: TenantPolicy
    version: str
    text: str


@dataclass(slots=True)
class FileFault:
    """A file that did not load, and the tenant it names where that can be told (the
    document's `tenant`, even if the rest is wrong), so its tenant can be reported."""

    path: Path
    error: PolicyError
    tenant: str = ""


def policy_version(text: str) -> str:
    """A policy's version: a digest of its text (the same on every host)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_policy_files(directory: Path) -> tuple[list[PolicyFile], list[FileFault]]:
    """Each policy file of `directory` on its own: one file's fault never stops the
    others (demo token files are skipped)."""
    if not directory.is_dir():
        error = PolicyError(str(directory), [Finding("", "not a directory of policy files")])
        return [], [FileFault(directory, error)]
    loaded: list[PolicyFile] = []
    faults: list[FileFault] = []
    for path in policy_files(directory):
        data: object = None
        try:
            text = read_text(path)
            data = parse_yaml(text, str(path))
            if not is_demo_tokens(data):
                version = policy_version(text)
                loaded.append(PolicyFile(path, load_policy_data(data, str(path)), version, text))
        except PolicyError as exc:
            named = data.get("tenant") if isinstance(data, dict) else None
            faults.append(FileFault(path, exc, named if isinstance(named, str) else ""))
    return loaded, faults


def load_policy_dir(directory: Path, budget: ForwardBudget = NO_BUDGET) -> dict[str, TenantPolicy]:
    """Every tenant policy in `directory` by tenant id; PolicyLoadError lists all faults."""
    loaded, faults = read_policy_files(directory)
    errors = [fault.error for fault in faults]
    errors += check_policy_set(((str(f.path), f.policy) for f in loaded), budget)
    if errors:
        raise PolicyLoadError(errors)
    return {f.policy.tenant: f.policy for f in loaded}


def authenticate(
    policies: dict[str, TenantPolicy], token: str
) -> tuple[TenantPolicy, AuthenticatedAgent] | None:
    """The tenant policy and agent a bearer token belongs to, or None."""
    token_hash = hash_token(token)
    for policy in policies.values():
        agent = agent_for_token_hash(policy, token_hash)
        if agent is not None:
            return policy, agent
    return None


def load_demo_tokens(path: Path) -> DemoTokens:
    source = str(path)
    data = parse_yaml(read_text(path), source)
    if not is_demo_tokens(data):
        raise PolicyError(source, [Finding("kind", f"must be {DEMO_TOKENS_KIND!r}")])
    assert isinstance(data, dict)
    tenant, policy = data.get("tenant"), data.get("policy")
    findings = []
    if not isinstance(tenant, str):
        findings.append(Finding("tenant", "must be the tenant id"))
    if not isinstance(policy, str):
        findings.append(Finding("policy", "must be the policy file's path, relative to this file"))
    tokens = _token_map(data, "tokens", "agent ids", findings)
    settlers = _token_map(data, "settlers", "tool names", findings, required=False)
    admins = _token_map(data, "admins", "tenant admin ids", findings, required=False)
    if findings:
        raise PolicyError(source, findings)
    assert isinstance(tenant, str) and isinstance(policy, str)
    return DemoTokens(tenant, path.parent / policy, tokens, settlers, admins)


def _token_map(
    data: dict[str, object], key: str, what: str, findings: list[Finding], required: bool = True
) -> dict[str, str]:
    value = data.get(key, None if required else {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        findings.append(Finding(key, f"must map {what} to token strings"))
        return {}
    return dict(value)


def check_demo_tokens(path: Path) -> DemoTokens:
    """A demo token file whose every token is the one its policy names for that agent,
    tool settler or tenant admin."""
    demo = load_demo_tokens(path)
    policy = read_policy_file(demo.policy)
    findings: list[Finding] = []
    if policy.tenant != demo.tenant:
        findings.append(Finding("tenant", f"{demo.policy} is tenant {policy.tenant!r}"))
    for agent_id, token in demo.tokens.items():
        agent = agent_for_token_hash(policy, hash_token(token))
        if agent is None or agent.agent_id != agent_id:
            findings.append(
                Finding(
                    f"tokens.{agent_id}",
                    f"does not match the agent's token_sha256 in {demo.policy}",
                )
            )
    doc = policy.document
    hashes = {f"settlers.{name}": tool.settler_token_sha256 for name, tool in doc.tools.items()}
    hashes |= {f"admins.{name}": admin.token_sha256 for name, admin in doc.admins.items()}
    given = {f"settlers.{name}": token for name, token in demo.settlers.items()}
    given |= {f"admins.{name}": token for name, token in demo.admins.items()}
    for where, token in given.items():
        if hashes.get(where) != hash_token(token):
            findings.append(Finding(where, f"does not match its token hash in {demo.policy}"))
    if findings:
        raise PolicyError(str(path), findings)
    return demo


def merge_edit(base: str, edited: str, current: str, source: str) -> tuple[str, list[str]]:
    """The text of `current` (the store's version) with the fields `edited` changes
    from `base` applied (pricing/merge.py), and the fields whose newer values in
    `current` it replaced. `edited` itself where that is the result (its comments and
    layout kept), else YAML written from the merged document. PolicyError, against
    `source`, if the merged policy does not load or the ledger would refuse it."""
    parsed = [parse_yaml(text, source) for text in (base, edited, current)]
    try:
        merged = merge_documents(*parsed)
    except ValueError as exc:
        raise PolicyError(source, [Finding("", str(exc))]) from None
    text = edited
    if merged.document != parsed[1]:
        text = yaml.safe_dump(merged.document, sort_keys=False, allow_unicode=True)
    try:
        policy = load_policy_data(merged.document, source)
    except PolicyError as exc:
        detail = "this edit, applied onto the store's newer version, does not load"
        raise PolicyError(source, [Finding("", detail), *exc.findings]) from None
    if errors := ledger_errors(source, policy):
        raise errors[0]
    return text, merged.overridden
