"""The tenants a gateway serves: their policies, loaded from a directory, reloaded
when a file changes (every worker checks, so a change reaches all of them without a
restart), and the ledger accounts each policy names. How a file and the fleet's
policy store decide what is served is state/policy_sync.py; where each tool's
requests go, state/upstreams.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.edge import metrics
from gateway.state import policy_changes, policy_sync
from gateway.state.credentials import resolve_credentials, secret_files_signature
from gateway.state.http_upstream import HttpTarget
from gateway.state.keyring import Keyring
from gateway.state.policies import (
    NO_BUDGET,
    FileFault,
    ForwardBudget,
    PolicyLoadError,
    ledger_account,
    policy_files,
    policy_version,
    read_policy_files,
)
from gateway.state.policy_changes import NO_VERSION, StoreVersion
from gateway.state.policy_sync import InForce
from gateway.state.supervision import Supervision
from gateway.state.upstreams import Upstreams
from ledger import AccountSpec as LedgerAccount
from ledger import (
    ChangeFeed,
    KeyKind,
    Ledger,
    LedgerUnavailable,
    OpenPool,
)
from pricing import (
    FACTOR_PREFIX,
    AdminRole,
    AuthenticatedAgent,
    Evidence,
    Outcomes,
    PolicyError,
    TenantPolicy,
    factor_account,
    hash_token,
    load_policy_text,
    policy_accounts,
    with_observed,
    with_settled,
)

if TYPE_CHECKING:
    from gateway.state.mcp_upstream import McpUpstream

log = logging.getLogger("irrev.gateway")


# How often every tenant's record is read whatever the epoch said (the bound on a
# write whose epoch bump was lost): one pipelined read of the tenants a worker
# serves, as often as before the feed, when it ran every 15 two-second looks. The
# gateway's setting IRREV_POLICY_FULL_READ_S (settings.py) has the same default.
FULL_READ_S = 30.0

DEFAULT_SUPERVISION = Supervision()


# What settlements taught: compensation outcomes and settled residual factors, each
# by tenant and route id.
Observed = dict[str, dict[str, Outcomes]]
Settled = dict[str, dict[str, Evidence]]


def _learned(
    policy: TenantPolicy, observed: dict[str, Outcomes] | None, settled: dict[str, Evidence] | None
) -> TenantPolicy:
    """The policy priced with what was learned; as written if that cannot be applied:
    learned counts must never stop a tenant's policy (and its revocations) loading."""
    if not observed and not settled:
        return policy
    try:
        if settled:
            policy = with_settled(policy, settled)
        return with_observed(policy, observed) if observed else policy
    except ValueError:
        log.exception("learned outcomes not applied", extra={"tenant": policy.tenant})
        return policy


@dataclass
class LoadReport:
    """What a load put in force (`tenants`) and which files it could not use: each
    such file's tenant keeps the policy it had (a tenant whose file never loaded has
    none), and every other tenant's file is applied regardless."""

    tenants: list[str] = field(default_factory=list)
    faults: list[FileFault] = field(default_factory=list)

    def errors_of(self, path: Path) -> list[PolicyError]:
        return [fault.error for fault in self.faults if fault.path == path]


@dataclass(frozen=True, slots=True)
class Uploaded:
    """An upload stored as `version`; `limits_pending`: not yet served here, its
    limits to be written at the next look."""

    policy: TenantPolicy
    version: StoreVersion
    limits_pending: bool = False


class TenantStore:
    """`policies` are what prices are computed with: each policy as written, with the
    compensation outcomes counted so far applied (pricing.with_observed)."""

    def __init__(
        self,
        directory: Path,
        budget: ForwardBudget = NO_BUDGET,
        supervision: Supervision = DEFAULT_SUPERVISION,
        instance: str = "",
    ) -> None:
        self.directory = directory
        # Who this gateway is in the fleet (IRREV_INSTANCE): with a file's path, the
        # source whose reads the store remembers (`policy_sync.take_in`).
        self.instance = instance or socket.gethostname()
        self.budget = budget
        self.policies: dict[str, TenantPolicy] = {}
        self._in_force: dict[Path, InForce] = {}
        self._written: dict[str, TenantPolicy] = {}
        self._observed: Observed = {}
        self._settled: Settled = {}
        # Each calibrating route's holds open across the fleet as the last reserve of
        # this process on it saw them, by (tenant, route id): what its next hold is
        # priced for (gateway/pipeline/reserve.py; the ledger sends back a price made for
        # more than are open).
        self.pools: dict[tuple[str, str], OpenPool] = {}
        self._agents: dict[str, tuple[TenantPolicy, AuthenticatedAgent]] = {}
        self._settlers: dict[str, tuple[TenantPolicy, str]] = {}
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._upstreams = Upstreams(supervision)
        # A tenant's opening of its missing accounts under way (`open_missing`), which
        # every reserve of it that meets an unknown account meanwhile waits for.
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._admins: dict[str, tuple[str, str, AdminRole]] = {}
        # Agent and admin keys managed at run time, consulted after the policies' own.
        self.keyring = Keyring()
        self._secret_files: tuple[tuple[str, int, int], ...] = ()
        self._epoch = -1
        self._outcomes_epoch = -1
        self._heard = 0
        self._poll_due = 0.0
        self._full_read_due = 0.0
        # What refresh() schedules its reads by (a test drives it with a fake one).
        self.clock: Callable[[], float] = time.monotonic
        # The policy files on disk that are not in force, each with its tenant where
        # that can be told.
        self.faults: list[FileFault] = []
        # Files that differ from the store's version, with the digest they differ from.
        self._behind: dict[Path, str] = {}

    def authenticate(self, token: str) -> tuple[TenantPolicy, AuthenticatedAgent] | None:
        """The agent a token opens: one named in a policy, or a managed key's, which
        opens only an agent its tenant's policy in force still has."""
        token_hash = hash_token(token)
        if (found := self._agents.get(token_hash)) is not None:
            return found
        key = self.keyring.find(token_hash)
        if key is None or key.kind is not KeyKind.AGENT:
            return None
        policy = self.policies.get(key.tenant)
        agent = policy.agents_by_id.get(key.member) if policy is not None else None
        if policy is None or agent is None:
            return None
        self.keyring.used(key)
        return policy, agent

    def tenant_admin(self, token: str) -> tuple[str, str, AdminRole] | None:
        """(tenant, admin id, role) of a tenant admin's token: a policy's admin, or a
        managed admin key of a tenant served."""
        token_hash = hash_token(token)
        if (found := self._admins.get(token_hash)) is not None:
            return found
        key = self.keyring.find(token_hash)
        if key is None or key.role is None or key.tenant not in self.policies:
            return None
        self.keyring.used(key)
        return key.tenant, key.member, key.role

    def settler(self, token: str) -> tuple[TenantPolicy, str] | None:
        """The tenant and tool whose settler credential `token` is."""
        return self._settlers.get(hash_token(token))

    def served(self, tenant: str) -> InForce | None:
        """The tenant's policy in force here: its text and its store version."""
        return self._by_tenant().get(tenant)

    def versions(self) -> dict[str, tuple[str, float]]:
        """tenant -> (version of its policy in force, when it was applied)."""
        entries = self._in_force.values()
        return {e.file.policy.tenant: (e.file.version, e.applied_at) for e in entries}

    def files_changed(self) -> bool:
        """Whether a policy file changed (or came or went) since the last load; a
        directory that cannot be read is left to the next load to report."""
        try:
            return self._files_signature() != self._signature
        except OSError:
            return False

    def _files_signature(self) -> tuple[tuple[str, int, int], ...]:
        stats = ((p.name, p.stat()) for p in policy_files(self.directory))
        return tuple((name, st.st_mtime_ns, st.st_size) for name, st in stats)

    async def load(self, ledger: Ledger) -> list[str]:
        """`apply`, then PolicyLoadError if any file was not applied (its tenant keeps
        its previous policy; the other files were applied)."""
        report = await self.apply(ledger)
        if report.faults:
            raise PolicyLoadError([fault.error for fault in report.faults])
        return report.tenants

    async def apply(self, ledger: Ledger) -> LoadReport:
        """(Re)load every policy file on its own, take what was edited in them into
        the fleet's policy store (`policy_sync.take_in`), serve the store's version of
        each tenant (`policy_sync.serve_store`) and write the accounts of each policy
        in force. A file that does not load, resolve its credentials or agree with the
        other policies in force (a shared token, a tenant defined twice) leaves its
        tenant on the policy it had: one tenant's broken file never holds back another's
        change. Redis errors raise, and then nothing changes here (what was already
        written to the store is served at the next look)."""
        signature = self._files_signature()
        files, faults = read_policy_files(self.directory)
        local, faults = policy_sync.choose(files, faults, self._in_force, self.budget)
        epoch = await ledger.policies.epoch()
        records = await ledger.policies.records(
            sorted({e.file.policy.tenant for e in local.values()})
        )
        read = {file.path: file for file in files}
        edited = {p: e for p, e in local.items() if e.file is read.get(p)}
        faults += await policy_sync.take_in(ledger, self.instance, edited, records)
        chosen, stale, self._behind = policy_sync.serve_store(
            local, records, self._in_force, self._behind, self.budget
        )
        faults += stale
        _, escrowed = await policy_sync.open_accounts(
            ledger,
            [
                (entry.file.policy.tenant, ledger_account(spec), entry.version)
                for entry in chosen.values()
                for spec in policy_accounts(entry.file.policy)
            ],
        )
        faults += policy_sync.escrowed_faults(chosen, escrowed)
        written = {e.file.policy.tenant: e.file.policy for e in chosen.values()}
        # Read before anything changes: Redis failing here leaves the store as it was,
        # not with new policies that were never priced with what was learned.
        observed, settled = await self._read_observed(ledger, list(written))
        policy_sync.report(self._in_force, self.faults, chosen, faults)
        self._in_force = chosen
        self._written = written
        self.faults = faults
        self._signature = signature
        self._epoch = epoch
        credentials = {t: e.credentials for t, e in self._by_tenant().items()}
        self._upstreams.rebuild(
            self._written.values(), credentials, self.budget.min_hold_ttl_ms / 1000
        )
        self._secret_files = secret_files_signature(self._written.values())
        self._install(observed, settled)
        return LoadReport(sorted(self._written), faults)

    async def open_missing(self, ledger: Ledger, tenant: str) -> None:
        """Write the accounts of `tenant`'s policy in force that Redis lacks, or holds
        from an older version (`policy_sync.open_accounts`), for a reserve that met an
        unknown account: a tenant's, principal's or agent's account is never closed
        (close.lua closes factor accounts, which a reserve opens itself), so Redis lost
        it (a failover, a flush), and each tenant meets its loss at its own first
        reserve. Only
        this tenant's accounts are read and written, and no policy is reloaded: a
        reload of every tenant here made each tenant's miss cost the whole fleet's
        files, records and accounts. Concurrent misses of the tenant (a burst on a
        Redis that lost it) wait for one opening rather than each writing the same
        accounts again. The limits go under the store's version number for the text
        served, or 0 when the store no longer holds it (docs/design.md, "Limits
        never flip back")."""
        opening = self._opening.get(tenant)
        if opening is None:
            opening = asyncio.get_running_loop().create_task(self._open_missing(ledger, tenant))
            self._opening[tenant] = opening
            opening.add_done_callback(lambda _: self._opening.pop(tenant, None))
        # Shielded: a caller that gives up (its client left) must not cancel the
        # opening the others wait for.
        await asyncio.shield(opening)

    async def _open_missing(self, ledger: Ledger, tenant: str) -> None:
        entry = self.served(tenant)
        if entry is None:
            return  # no longer served: the reserve tried again says the account is unknown
        # Under the store's number for the text served, never this host's alone: Redis
        # may have lost the store's record with the accounts (a flush), and limits
        # written under a number the store does not hold would be newer than the
        # versions it writes next, which account.lua would keep out. Under 0 they only
        # fill what is missing, replaced by any version's limits.
        stored = (await ledger.policies.records([tenant])).get(tenant)
        version = stored.version if stored and stored.digest == entry.file.version else 0
        policy = entry.file.policy
        specs = [(tenant, ledger_account(spec), version) for spec in policy_accounts(policy)]
        opened, _ = await policy_sync.open_accounts(ledger, specs)
        # Accounts a served policy names went missing from Redis: worth an operator's look.
        log.warning("opened missing accounts", extra={"tenant": tenant, "accounts": opened})

    async def aclose(self) -> None:
        """Close every MCP server (clients, processes), the retired ones' at once (at
        shutdown)."""
        await self._upstreams.aclose()

    def _by_tenant(self) -> dict[str, InForce]:
        return {entry.file.policy.tenant: entry for entry in self._in_force.values()}

    def target(self, tenant: str, tool: str) -> HttpTarget | None:
        """Where and how requests to `tool` of `tenant` go; None without an upstream."""
        return self._upstreams.targets.get((tenant, tool))

    def mcp_upstream(self, tenant: str, tool: str) -> McpUpstream | None:
        """The tenant's MCP server `tool`; None if it has no such server."""
        return self._upstreams.mcp.get((tenant, tool))

    async def refresh(
        self,
        ledger: Ledger,
        feed: ChangeFeed | None = None,
        poll_s: float = 0.0,
        full_read_s: float = FULL_READ_S,
    ) -> bool:
        """Reload if any policy file or credential file changed since the last load
        (a rotated secret reaches every worker) or the fleet's policy store did;
        apply compensation outcomes counted since the last look.

        With a `feed` (ledger/changes.py), the store's epochs are read only when the
        feed heard something since the last look (an announced write, or a
        resubscription after which an announcement may have been missed), while it
        is not subscribed, or `poll_s` after the last read: an idle host sends
        Redis nothing most refreshes. Without one, they are read every look. Every
        `full_read_s`, whatever the feed and `poll_s`, every tenant's record is read
        too: that catches a write whose epoch bump was lost (its writer died before
        the INCR, or the INCR failed), so a revocation reaches this host within
        `full_read_s` plus one look even then. While the fleet's watcher beats
        (`feed.watched`), it does both for every host (gateway/state/fleetwatch.py: it
        announces an epoch that moved unannounced, bumps it for a version that moved
        unbumped), and this host reads the store only when told."""
        rotated = secret_files_signature(self._written.values()) != self._secret_files
        heard = feed.heard("policy", "outcomes") if feed is not None else 0
        if feed is not None:
            metrics.POLICY_FEED_LIVE.set(1 if feed.live else 0)
        now = self.clock()
        watched = feed is not None and feed.watched
        polled = now >= self._poll_due and not watched
        if feed is None or not feed.live or heard != self._heard or polled:
            policies, outcomes = await ledger.policies.epochs()
            self._poll_due = now + poll_s
        else:
            policies, outcomes = self._epoch, self._outcomes_epoch
        # On its own schedule, not every so many polls: with the feed the poll runs
        # every poll_s (30 s), and a full read every 15 of them left a lost bump's
        # revocation unserved for 450 s. Rescheduled only once done: one that failed
        # (Redis down) is tried again at the next look, not full_read_s later.
        full_read = now >= self._full_read_due and not watched
        if (
            rotated
            or policies != self._epoch
            or self._files_signature() != self._signature
            or (full_read and await self._store_moved(ledger))
        ):
            await self.apply(ledger)
            self._outcomes_epoch = outcomes
            self._heard = heard
            self._full_read_due = now + full_read_s  # apply read every record
            return True
        if full_read:
            self._full_read_due = now + full_read_s
        if outcomes != self._outcomes_epoch:
            observed, settled = await self._read_observed(ledger, list(self._written))
            self._outcomes_epoch = outcomes
            if observed != self._observed or settled != self._settled:
                self._install(observed, settled)
        # Only now: a look that failed (Redis down) leaves what was heard to the next.
        self._heard = heard
        return False

    async def _store_moved(self, ledger: Ledger) -> bool:
        """Whether the store holds another version than the one in force of any
        tenant served (one read of each tenant's record)."""
        records = await ledger.policies.records(list(self._written))
        in_force = {tenant: version for tenant, (version, _) in self.versions().items()}
        return any(record.digest != in_force.get(t) for t, record in records.items())

    @staticmethod
    async def _read_observed(ledger: Ledger, tenants: list[str]) -> tuple[Observed, Settled]:
        """The `tenants`' counted outcomes and settled residual factors."""
        counted = await ledger.outcomes(tenants)
        factors = await ledger.settled_factors(tenants)
        observed = {
            tenant: {route: Outcomes(c.failures, c.successes) for route, c in routes.items()}
            for tenant, routes in counted.items()
        }
        settled: Settled = {}
        for tenant, routes in factors.items():
            settled[tenant] = {}
            for route, f in routes.items():
                try:
                    ev = Evidence.from_ppm(f.n, f.total_ppm, f.total_sq_ppm, f.top_ppm)
                except ValueError:  # never stop a policy loading; price from the prior
                    log.exception("settled factors not applied", extra={"tenant": tenant})
                    continue
                settled[tenant][route] = ev
        return observed, settled

    def _install(self, observed: Observed, settled: Settled) -> None:
        self.policies = {
            tenant: _learned(policy, observed.get(tenant), settled.get(tenant))
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
        self._settled = settled

    async def upload(
        self, ledger: Ledger, tenant: str, text: str, base: StoreVersion | None, origin: str
    ) -> Uploaded:
        """Validate a policy made from the store's version `base` (the ETag its maker
        read; None: not said) and write it into the store, then serve it. Once stored
        it is the fleet's: if serving it here fails (Redis refused an account's
        limits), it is still stored, and every host's next look writes the limits
        (`Uploaded.limits_pending`). Made from an older version than the store's,
        only the fields it changes are written, and refused (PolicyContended) where
        the store changed one of them since to another value (docs/design.md, "Policy
        changes"). The
        host's file is not written: the store is the truth, a file one way in."""
        policy = load_policy_text(text, f"uploaded policy of {tenant}")
        if policy.tenant != tenant:
            raise ValueError(f"the policy is for tenant {policy.tenant!r}, not {tenant!r}")
        resolve_credentials(policy)  # a missing secret refuses the upload, not the next load
        target = self.file_of(tenant)
        for _ in range(policy_sync.EDIT_ATTEMPTS):
            record = (await ledger.policies.records([tenant])).get(tenant)
            current = StoreVersion(record.version, record.digest) if record else NO_VERSION
            if base is None:
                raise policy_changes.base_required(current)
            merged = text
            if record is not None and base != current:
                merged = await policy_sync.merged_upload(ledger, tenant, text, base, record)
            elif record is None and base.number != 0:
                raise policy_changes.unknown_version(base, current)
            proposed = load_policy_text(merged, f"uploaded policy of {tenant}")
            policy_sync.check_upload(self._in_force, target, proposed, self.budget)
            result = await ledger.policies.put(
                tenant,
                expected=current.number,
                expected_digest=current.digest,
                digest=policy_version(merged),
                text=merged,
                origin=origin,
            )
            if not result.won:
                continue
            stored = StoreVersion(result.version, result.digest)
            try:
                await self.apply(ledger)
            except LedgerUnavailable as exc:
                log.warning(
                    "policy stored; its limits are written at the next look",
                    extra={"tenant": tenant, "version": result.version, "why": str(exc)},
                )
                return Uploaded(policy, stored, limits_pending=True)
            return Uploaded(self.policies.get(tenant, policy), stored)
        raise policy_changes.busy(current)

    def file_of(self, tenant: str) -> Path:
        """The file that holds (or would hold) `tenant`'s policy."""
        for path in policy_files(self.directory):
            try:
                if load_policy_text(path.read_text(encoding="utf-8"), str(path)).tenant == tenant:
                    return path
            except ValueError:
                continue
        return self.directory / f"{tenant}.yaml"


def factor_accounts(policy: TenantPolicy, accounts: Iterable[str]) -> list[LedgerAccount]:
    """The risk-factor accounts among a hold's `accounts`, as their pattern caps them:
    the reserve opens those Redis lacks, only for a hold it keeps."""
    factors = (a.removeprefix(FACTOR_PREFIX) for a in accounts if a.startswith(FACTOR_PREFIX))
    specs = (factor_account(policy, factor) for factor in factors)
    return [ledger_account(spec) for spec in specs if spec is not None]
