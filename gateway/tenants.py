"""The tenants a gateway serves: their policies, loaded from a directory, reloaded
when a file changes (every worker checks, so a change reaches all of them without a
restart), and the ledger accounts each policy names."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ledger import AccountSpec as LedgerAccount
from ledger import Ledger
from pricing import (
    AccountSpec,
    Outcomes,
    PolicyError,
    TenantPolicy,
    factor_account,
    load_policy_data,
    load_policy_text,
    parse_yaml,
    policy_accounts,
    with_observed,
)
from pricing.catalog import FACTOR_PREFIX
from pricing.credentials import AuthenticatedAgent, hash_token
from pricing.policy import AdminRole, McpErrorMeaning

from .credentials import Injected, resolve_credentials
from .http_upstream import HttpTarget
from .policies import (
    NO_BUDGET,
    ForwardBudget,
    PolicyLoadError,
    check_policy_set,
    is_demo_tokens,
    load_policy_dir,
    policy_files,
    read_text,
)
from .wire import KEPT_RESPONSE_HEADERS

if TYPE_CHECKING:
    from .mcp_upstream import McpUpstream

log = logging.getLogger("irrev.gateway")


def ledger_account(spec: AccountSpec) -> LedgerAccount:
    return LedgerAccount(
        account=spec.account_id,
        limit=spec.limit_micros,
        soft_limit=spec.soft_limit_micros,
        window_ms=spec.window_ms,
        approval_threshold=spec.approval_threshold_micros or 0,
    )


async def _open_account(ledger: Ledger, tenant: str, spec: LedgerAccount) -> None:
    """Create or change an account only where Redis differs from the policy: every
    worker loads every policy, and an unchanged account needs no journal entry."""
    current = await ledger.balance(tenant, spec.account)
    if current is None or (
        current.limit,
        current.soft_limit,
        current.window_ms,
        current.approval_threshold,
    ) != (spec.limit, spec.soft_limit, spec.window_ms, spec.approval_threshold):
        await ledger.upsert_account(tenant, spec)


def _learned(policy: TenantPolicy, observed: dict[str, Outcomes] | None) -> TenantPolicy:
    """The policy priced with what was learned; as written if that cannot be applied:
    learned counts must never stop a tenant's policy (and its revocations) loading."""
    if not observed:
        return policy
    try:
        return with_observed(policy, observed)
    except ValueError:
        log.exception("learned outcomes not applied", extra={"tenant": policy.tenant})
        return policy


class TenantStore:
    """`policies` are what prices are computed with: each policy as written, with the
    compensation outcomes counted so far applied (pricing.with_observed)."""

    def __init__(self, directory: Path, budget: ForwardBudget = NO_BUDGET) -> None:
        self.directory = directory
        self.budget = budget
        self.policies: dict[str, TenantPolicy] = {}
        self._written: dict[str, TenantPolicy] = {}
        self._observed: dict[str, dict[str, Outcomes]] = {}
        self._agents: dict[str, tuple[TenantPolicy, AuthenticatedAgent]] = {}
        self._settlers: dict[str, tuple[TenantPolicy, str]] = {}
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._targets: dict[tuple[str, str], HttpTarget] = {}
        self._mcp: dict[tuple[str, str], McpUpstream] = {}
        self._admins: dict[str, tuple[str, str, AdminRole]] = {}
        self._secret_files: tuple[tuple[str, int, int], ...] = ()

    def authenticate(self, token: str) -> tuple[TenantPolicy, AuthenticatedAgent] | None:
        return self._agents.get(hash_token(token))

    def tenant_admin(self, token: str) -> tuple[str, str, AdminRole] | None:
        """(tenant, admin id, role) of a tenant admin's token."""
        return self._admins.get(hash_token(token))

    def settler(self, token: str) -> tuple[TenantPolicy, str] | None:
        """The tenant and tool whose settler credential `token` is."""
        return self._settlers.get(hash_token(token))

    def _files_signature(self) -> tuple[tuple[str, int, int], ...]:
        stats = ((p.name, p.stat()) for p in policy_files(self.directory))
        return tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats)

    async def load(self, ledger: Ledger) -> list[str]:
        """(Re)load every policy and create or update the accounts each names. On a
        faulty directory the previous policies stay in force (PolicyLoadError)."""
        signature = self._files_signature()
        policies = load_policy_dir(self.directory, self.budget)
        credentials = _credentials_of(policies.values())
        for policy in policies.values():
            for spec in policy_accounts(policy):
                await _open_account(ledger, policy.tenant, ledger_account(spec))
        self._written = policies
        self._signature = signature
        self._targets = _targets(policies.values(), credentials)
        self._mcp = _mcp_upstreams(policies.values(), credentials)
        self._secret_files = _secret_files_signature(policies.values())
        self._install(await self._read_observed(ledger))
        return sorted(policies)

    def target(self, tenant: str, tool: str) -> HttpTarget | None:
        """Where and how requests to `tool` of `tenant` go; None without an upstream."""
        return self._targets.get((tenant, tool))

    def mcp_upstream(self, tenant: str, tool: str) -> McpUpstream | None:
        """The tenant's MCP server `tool`; None if it has no such server."""
        return self._mcp.get((tenant, tool))

    async def refresh(self, ledger: Ledger) -> bool:
        """Reload if any policy file or credential file changed since the last load
        (a rotated secret reaches every worker); apply compensation outcomes counted
        since the last look."""
        rotated = _secret_files_signature(self._written.values()) != self._secret_files
        if rotated or self._files_signature() != self._signature:
            await self.load(ledger)
            return True
        observed = await self._read_observed(ledger)
        if observed != self._observed:
            self._install(observed)
        return False

    async def _read_observed(self, ledger: Ledger) -> dict[str, dict[str, Outcomes]]:
        """Every tenant's counted outcomes, in one round trip."""
        counted = await ledger.outcomes(list(self._written))
        return {
            tenant: {route: Outcomes(c.failures, c.successes) for route, c in routes.items()}
            for tenant, routes in counted.items()
        }

    def _install(self, observed: dict[str, dict[str, Outcomes]]) -> None:
        self.policies = {
            tenant: _learned(policy, observed.get(tenant))
            for tenant, policy in self._written.items()
        }
        self._agents = {
            agent_hash: (policy, agent)
            for policy in self.policies.values()
            for agent_hash, agent in policy.agents_by_hash.items()
        }
        self._admins = {
            admin.token_sha256: (tenant, admin_id, admin.role)
            for tenant, policy in self.policies.items()
            for admin_id, admin in policy.document.admins.items()
        }
        self._settlers = {
            tool.settler_token_sha256: (policy, name)
            for policy in self.policies.values()
            for name, tool in policy.document.tools.items()
            if tool.settler_token_sha256 is not None
        }
        self._observed = observed

    async def upload(self, ledger: Ledger, tenant: str, text: str) -> TenantPolicy:
        """Validate a policy, then write it atomically as `<tenant>.yaml` and load."""
        policy = load_policy_text(text, f"uploaded policy of {tenant}")
        if policy.tenant != tenant:
            raise ValueError(f"the policy is for tenant {policy.tenant!r}, not {tenant!r}")
        target = self.file_of(tenant)
        _credentials_of([policy])  # a missing secret refuses the upload, not the next load
        # Valid alone is not enough: the directory must stay loadable as a whole (no
        # token shared with another tenant's agent), or the file would break every
        # reload and the next start while the upload was reported refused.
        errors = check_policy_set(
            [*self._other_policies(target), (str(target), policy)], self.budget
        )
        if errors:
            raise PolicyLoadError(errors)
        previous = target.read_text(encoding="utf-8") if target.exists() else None
        self._write(target, text)
        try:
            await self.load(ledger)
        except BaseException:
            # Refused is refused: the file goes back as it was, so the next reload (or
            # restart) does not apply what this answer said was not applied.
            if previous is None:
                target.unlink(missing_ok=True)
            else:
                self._write(target, previous)
            raise
        return self.policies[tenant]

    def _write(self, target: Path, text: str) -> None:
        handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, target)

    def _other_policies(self, skip: Path) -> list[tuple[str, TenantPolicy]]:
        loaded = []
        for path in policy_files(self.directory):
            data = parse_yaml(read_text(path), str(path))
            if path != skip and not is_demo_tokens(data):
                loaded.append((str(path), load_policy_data(data, str(path))))
        return loaded

    def file_of(self, tenant: str) -> Path:
        """The file that holds (or would hold) `tenant`'s policy."""
        for path in policy_files(self.directory):
            try:
                if load_policy_text(path.read_text(encoding="utf-8"), str(path)).tenant == tenant:
                    return path
            except ValueError:
                continue
        return self.directory / f"{tenant}.yaml"


def _credentials_of(policies: Iterable[TenantPolicy]) -> dict[str, dict[str, Injected]]:
    """Every tenant's resolved tool credentials; a missing one refuses the whole load,
    like any other fault of a policy, so the previous policies stay in force."""
    resolved, errors = {}, []
    for policy in policies:
        try:
            resolved[policy.tenant] = resolve_credentials(policy)
        except PolicyError as exc:
            errors.append(exc)
    if errors:
        raise PolicyLoadError(errors)
    return resolved


def _targets(
    policies: Iterable[TenantPolicy], credentials: dict[str, dict[str, Injected]]
) -> dict[tuple[str, str], HttpTarget]:
    """Each tool's upstream as the gateway calls it, built once per load, not per
    forward: its URL, its credentials, the answer headers kept, what means "still in
    progress"."""
    return {
        (policy.tenant, name): HttpTarget(
            tool.upstream,
            credentials.get(policy.tenant, {}).get(name, ()),
            KEPT_RESPONSE_HEADERS | {header.lower() for header in tool.response_headers},
            frozenset(tool.in_progress_statuses),
        )
        for policy in policies
        for name, tool in policy.document.tools.items()
        if tool.upstream is not None
    }


def _mcp_upstreams(
    policies: Iterable[TenantPolicy], credentials: dict[str, dict[str, Injected]]
) -> dict[tuple[str, str], McpUpstream]:
    """Each MCP server of each tenant, with its credentials and the tools whose
    `isError` means "not executed" (route field `is_error`). The MCP SDK is imported
    only where a tenant has an MCP server (it is most of a worker's import time)."""
    policies = list(policies)
    if not any(tool.mcp for policy in policies for tool in policy.document.tools.values()):
        return {}
    from .mcp_upstream import McpUpstream

    upstreams = {}
    for policy in policies:
        for name, tool in policy.document.tools.items():
            if tool.mcp is None:
                continue
            not_executed = frozenset(
                route.template.text.removeprefix("/")
                for route in policy.catalog.by_tool.get(name, ())
                if policy.document.routes[route.index].is_error is McpErrorMeaning.NOT_EXECUTED
            )
            creds = credentials.get(policy.tenant, {}).get(name, ())
            upstreams[(policy.tenant, name)] = McpUpstream(tool.mcp, creds, not_executed)
    return upstreams


def _secret_files_signature(policies: Iterable[TenantPolicy]) -> tuple[tuple[str, int, int], ...]:
    paths = {
        secret.file
        for policy in policies
        for tool in policy.document.tools.values()
        for secret in tool.credentials.values()
        if secret.file
    }
    signature = []
    for path in sorted(paths):
        try:
            stat = os.stat(path)
        except OSError:
            signature.append((path, 0, -1))
        else:
            signature.append((path, stat.st_mtime_ns, stat.st_size))
    return tuple(signature)


def factor_accounts(policy: TenantPolicy, accounts: Iterable[str]) -> list[LedgerAccount]:
    """The risk-factor accounts among a hold's `accounts`, as their pattern caps them:
    the reserve opens those Redis lacks, only for a hold it keeps."""
    factors = (a.removeprefix(FACTOR_PREFIX) for a in accounts if a.startswith(FACTOR_PREFIX))
    specs = (factor_account(policy, factor) for factor in factors)
    return [ledger_account(spec) for spec in specs if spec is not None]
