"""The tenants a gateway serves: their policies, loaded from a directory, reloaded
when a file changes (every worker checks, so a change reaches all of them without a
restart), and the ledger accounts each policy names."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ledger import (
    POLICY_HISTORY,
    AccountSpec,
    ChangeFeed,
    KeyKind,
    Ledger,
    LedgerUnavailable,
    OpenPool,
    PolicyRecord,
)
from pricing import (
    FACTOR_PREFIX,
    AdminRole,
    AuthenticatedAgent,
    Evidence,
    Finding,
    McpErrorMeaning,
    Outcomes,
    PolicyError,
    SecretSource,
    TenantPolicy,
    factor_account,
    hash_token,
    load_policy_text,
    policy_accounts,
    with_observed,
    with_settled,
)

from . import metrics, policy_changes
from .credentials import Injected, resolve_credentials
from .http_upstream import HttpTarget
from .keyring import Keyring
from .policies import (
    NO_BUDGET,
    FileFault,
    ForwardBudget,
    PolicyFile,
    PolicyLoadError,
    check_policy_set,
    ledger_account,
    ledger_errors,
    merge_edit,
    policy_files,
    policy_version,
    read_policy_files,
)
from .supervision import Supervision
from .wire import KEPT_RESPONSE_HEADERS

if TYPE_CHECKING:
    from .mcp_upstream import McpUpstream

log = logging.getLogger("irrev.gateway")


# How often every tenant's record is read whatever the epoch said (the bound on a
# write whose epoch bump was lost): one pipelined read of the tenants a worker
# serves, as often as before the feed, when it ran every 15 two-second looks. The
# gateway's setting IRREV_POLICY_FULL_READ_S (settings.py) has the same default.
FULL_READ_S = 30.0

DEFAULT_SUPERVISION = Supervision()

# Account changes in flight at once: enough to open a new tenant's accounts quickly,
# few enough to leave the connection pool to the admission path.
OPENING_CONCURRENCY = 8

# Compare-and-set attempts of one policy change before it is given up (a file's edit
# is then tried again at the next look; an upload is answered 409).
EDIT_ATTEMPTS = 5


async def _open_accounts(ledger: Ledger, accounts: list[tuple[str, AccountSpec, int]]) -> int:
    """Create each account Redis lacks, and write the limits of each whose limits come
    from an older version of its tenant's policy than the one served here (tenant,
    spec, store version). The version goes with the write (account.lua keeps an
    account's newer limits): two hosts that write two versions' limits in the wrong
    order leave the newer ones, and a host still serving an older version writes
    nothing. Every host that serves a version writes what is missing of it, so
    limits left unwritten by a writer that died are written by the next host to
    apply. What Redis holds is read in one pipelined round trip; the accounts to
    write are written a few at a time; the first error is raised once all have
    finished. Returns how many were written."""
    wanted: dict[str, list[str]] = {}
    for tenant, spec, _ in accounts:
        wanted.setdefault(tenant, []).append(spec.account)
    written = await ledger.policy_versions(wanted)
    changes = [
        (tenant, spec, version)
        for tenant, spec, version in accounts
        if written[tenant].get(spec.account, -1) < version
    ]
    gate = asyncio.Semaphore(OPENING_CONCURRENCY)

    async def upsert(tenant: str, spec: AccountSpec, version: int) -> None:
        async with gate:
            await ledger.upsert_account(tenant, spec, policy_version=version)

    results = await asyncio.gather(
        *(upsert(tenant, spec, version) for tenant, spec, version in changes),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return len(changes)


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
    version: int
    limits_pending: bool = False


@dataclass(frozen=True, slots=True)
class InForce:
    """A tenant's policy file in force: the policy as written, its digest, when it
    was applied (Unix time), its tools' credentials as resolved then, and its
    version in the fleet's policy store (0 until the store has it)."""

    file: PolicyFile
    credentials: dict[str, Injected]
    applied_at: float
    version: int = 0


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
        # source whose reads the store remembers (`_take_in`).
        self.instance = instance or socket.gethostname()
        self.budget = budget
        self.supervision = supervision
        self.policies: dict[str, TenantPolicy] = {}
        self._in_force: dict[Path, InForce] = {}
        self._written: dict[str, TenantPolicy] = {}
        self._observed: Observed = {}
        self._settled: Settled = {}
        # Each calibrating route's holds open across the fleet as the last reserve of
        # this process on it saw them, by (tenant, route id): what its next hold is
        # priced for (gateway/admission.py; the ledger sends back a price made for
        # more than are open).
        self.pools: dict[tuple[str, str], OpenPool] = {}
        self._agents: dict[str, tuple[TenantPolicy, AuthenticatedAgent]] = {}
        self._settlers: dict[str, tuple[TenantPolicy, str]] = {}
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._targets: dict[tuple[str, str], HttpTarget] = {}
        self._mcp: dict[tuple[str, str], McpUpstream] = {}
        self._closing: set[asyncio.Task[None]] = set()
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
        the fleet's policy store (`_take_in`), serve the store's version of each
        tenant (`_serve_store`) and write the accounts of each policy in force. A
        file that does not load, resolve its credentials or agree with the other
        policies in force (a shared token, a tenant defined twice) leaves its tenant
        on the policy it had: one tenant's broken file never holds back another's
        change. Redis errors raise, and then nothing changes here (what was already
        written to the store is served at the next look)."""
        signature = self._files_signature()
        files, faults = read_policy_files(self.directory)
        local, faults = self._choose(files, faults)
        epoch = await ledger.policies.epoch()
        records = await ledger.policies.records(sorted(self._tenants_of(local)))
        read = {file.path: file for file in files}
        edited = {p: e for p, e in local.items() if e.file is read.get(p)}
        faults += await self._take_in(ledger, edited, records)
        chosen, stale = self._serve_store(local, records)
        faults += stale
        await _open_accounts(
            ledger,
            [
                (entry.file.policy.tenant, ledger_account(spec), entry.version)
                for entry in chosen.values()
                for spec in policy_accounts(entry.file.policy)
            ],
        )
        written = {e.file.policy.tenant: e.file.policy for e in chosen.values()}
        # Read before anything changes: Redis failing here leaves the store as it was,
        # not with new policies that were never priced with what was learned.
        observed, settled = await self._read_observed(ledger, list(written))
        self._report(chosen, faults)
        self._in_force = chosen
        self._written = written
        self.faults = faults
        self._signature = signature
        self._epoch = epoch
        self._targets = _targets(
            self._written.values(), {t: e.credentials for t, e in self._by_tenant().items()}
        )
        self._mcp = self._keep_unchanged(
            _mcp_upstreams(
                self._written.values(),
                {t: e.credentials for t, e in self._by_tenant().items()},
                self.supervision,
            )
        )
        self._secret_files = _secret_files_signature(self._written.values())
        self._install(observed, settled)
        return LoadReport(sorted(self._written), faults)

    async def open_missing(self, ledger: Ledger, tenant: str) -> None:
        """Write the accounts of `tenant`'s policy in force that Redis lacks, or holds
        from an older version (`_open_accounts`), for a reserve that met an unknown
        account: a tenant's, principal's or agent's account is never closed (close.lua
        closes factor accounts, which a reserve opens itself), so Redis lost it (a
        failover, a flush), and each tenant meets its loss at its own first reserve. Only
        this tenant's accounts are read and written, and no policy is reloaded: a
        reload of every tenant here made each tenant's miss cost the whole fleet's
        files, records and accounts. Concurrent misses of the tenant (a burst on a
        Redis that lost it) wait for one opening rather than each writing the same
        accounts again."""
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
        policy = entry.file.policy
        specs = [(tenant, ledger_account(spec), entry.version) for spec in policy_accounts(policy)]
        opened = await _open_accounts(ledger, specs)
        # Accounts a served policy names went missing from Redis: worth an operator's look.
        log.warning("opened missing accounts", extra={"tenant": tenant, "accounts": opened})

    def _keep_unchanged(
        self, fresh: dict[tuple[str, str], McpUpstream]
    ) -> dict[tuple[str, str], McpUpstream]:
        """`fresh`, where a server is configured as before the one already in use (its
        connections and learnt protocol version, its running process); the others are
        closed once the deliveries begun through them have ended (they leaked on every
        reload): a stdio server whose command, environment or directory changed is
        stopped, and its successor started on first use."""
        kept = {}
        for key, upstream in fresh.items():
            old = self._mcp.get(key)
            kept[key] = old if old is not None and old.same_server(upstream) else upstream
        in_use = {id(upstream) for upstream in kept.values()}
        dropped = [upstream for upstream in self._mcp.values() if id(upstream) not in in_use]
        if dropped:
            grace_s = self.budget.min_hold_ttl_ms / 1000
            task = asyncio.get_running_loop().create_task(_retire(dropped, grace_s))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return kept

    async def aclose(self) -> None:
        """Close every MCP server (clients, processes), the retired ones' at once (at
        shutdown)."""
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(upstream.aclose() for upstream in self._mcp.values()))
        self._mcp = {}

    @staticmethod
    def _tenants_of(entries: dict[Path, InForce]) -> set[str]:
        return {entry.file.policy.tenant for entry in entries.values()}

    async def _take_in(
        self, ledger: Ledger, local: dict[Path, InForce], records: dict[str, PolicyRecord]
    ) -> list[FileFault]:
        """Put into the store what was edited in this host's files (`local`: those read
        now that are usable here; a file that is not keeps its tenant on the policy
        it had, and is taken in once it is) (docs/design.md, "Policy changes"). The
        store remembers what each file (its source: this gateway's instance name,
        IRREV_INSTANCE, and the file's path) held when this gateway last acted on it;
        an edit is what differs from that, field by field, and only those fields are
        written, over the store's current version
        (pricing/merge.py). A file the store already has, or that has not changed
        since, writes nothing: a stale copy changes nothing by being there, being
        touched or being served to a restarted host. A file seen for the first time
        while the store holds another version is recorded, not applied (its
        differences are not an edit anyone made here). A tenant the store lacks
        takes the file as it is. `records` is updated with what was written."""
        faults: list[FileFault] = []
        sources = {path: f"{self.instance}:{path.resolve()}" for path in local}
        tenants = {path: entry.file.policy.tenant for path, entry in local.items()}
        bases = await ledger.policies.bases([(tenants[p], sources[p]) for p in local])
        for path, entry in local.items():
            tenant, source, text = tenants[path], sources[path], entry.file.text
            base = bases.get((tenant, source))
            record = records.get(tenant)
            if base == text and record is not None:
                continue
            if record is not None and (base is None or record.digest == entry.file.version):
                await ledger.policies.read_by(tenant, source, text)
                continue
            try:
                records[tenant] = await self._write_edit(ledger, entry, source, base, record)
            except PolicyError as exc:
                faults.append(FileFault(path, exc, tenant))
        return faults

    async def _write_edit(
        self,
        ledger: Ledger,
        entry: InForce,
        source: str,
        base: str | None,
        record: PolicyRecord | None,
    ) -> PolicyRecord:
        """Write the edit of `entry`'s file (from `base`, what its source read) over
        `record` (the store's version, None: none yet), read again and merged again
        each time another writer got there first. PolicyError if the merged policy
        does not load."""
        tenant, text, path = entry.file.policy.tenant, entry.file.text, entry.file.path
        origin = f"file {source}"
        for _ in range(EDIT_ATTEMPTS):
            if record is not None and base is None:
                # Another host took the tenant in first: this copy is one seen for the
                # first time while the store holds a version.
                await ledger.policies.read_by(tenant, source, text)
                return record
            merged, overridden = text, list[str]()
            if record is not None and base is not None:
                merged, overridden = merge_edit(base, text, record.text, str(path))
            version = record.version if record is not None else 0
            result = await ledger.policies.put(
                tenant,
                expected=version,
                digest=policy_version(merged),
                text=merged,
                origin=origin,
                source=source,
                source_text=text,
            )
            if result.won:
                if overridden:
                    log.info(
                        "policy edit replaced newer values",
                        extra={"tenant": tenant, "file": str(path), "fields": overridden},
                    )
                return PolicyRecord(
                    tenant=tenant,
                    version=result.version,
                    digest=policy_version(merged),
                    text=merged,
                    stamp_ms=result.stamp_ms,
                    origin=origin,
                )
            record = (await ledger.policies.records([tenant])).get(tenant)
        raise PolicyError(
            str(path),
            [
                Finding(
                    "",
                    f"not applied: the store changed {EDIT_ATTEMPTS} times while this "
                    "edit was written; it is tried again at the next look",
                )
            ],
        )

    def _serve_store(
        self, local: dict[Path, InForce], records: dict[str, PolicyRecord]
    ) -> tuple[dict[Path, InForce], list[FileFault]]:
        """What is served for each tenant this host has a file of: the store's version.
        A file that differs from it is reported (it is not in force here); a stored
        version this host cannot use (it does not load, its credentials are missing
        here, or it disagrees with the others in force) leaves the tenant on the
        policy it had. A file that differs from the store's version is no fault: the
        store is the truth, and what is edited in the file is taken in (`_take_in`);
        it is logged once per version."""
        now = time.time()
        chosen: dict[Path, InForce] = {}
        faults: list[FileFault] = []
        behind: dict[Path, str] = {}
        for path, entry in local.items():
            tenant = entry.file.policy.tenant
            record = records.get(tenant)
            if record is None:
                chosen[path] = entry
                continue
            if record.digest == entry.file.version:
                chosen[path] = replace(entry, version=record.version)
                continue
            if self._behind.get(path) != record.digest:
                log.info("policy file differs from the store", extra=_behind(path, record))
            behind[path] = record.digest
            old = self._in_force.get(path)
            if old is not None and old.file.version == record.digest:
                chosen[path] = old
                continue
            try:
                policy = load_policy_text(record.text, _store_source(record))
                if policy.tenant != tenant:
                    raise PolicyError(_store_source(record), [Finding("tenant", "not " + tenant)])
                refused = ledger_errors(_store_source(record), policy)
                if refused:
                    raise refused[0]
                candidate = InForce(
                    PolicyFile(path, policy, record.digest, record.text),
                    resolve_credentials(policy),
                    now,
                    record.version,
                )
            except PolicyError as exc:
                faults.append(FileFault(path, exc, tenant))
                chosen[path] = old or entry
                continue
            chosen[path] = candidate
        errors = check_policy_set([(str(p), e.file.policy) for p, e in chosen.items()], self.budget)
        for error in errors:
            path = Path(error.source)
            kept = self._in_force.get(path) or local.get(path)
            if kept is not None and chosen.get(path) is not kept:
                chosen[path] = kept
                faults.append(FileFault(path, error, kept.file.policy.tenant))
        self._behind = behind
        return chosen, faults

    def _by_tenant(self) -> dict[str, InForce]:
        return {entry.file.policy.tenant: entry for entry in self._in_force.values()}

    def _choose(
        self, files: list[PolicyFile], faults: list[FileFault]
    ) -> tuple[dict[Path, InForce], list[FileFault]]:
        """Which policy each file puts in force: the file as it is now if it loads and
        agrees with everything already chosen, else the policy it had before."""
        now = time.time()
        previous = self._in_force
        chosen: dict[Path, InForce] = {}

        def admit(entry: InForce) -> list[PolicyError]:
            source = str(entry.file.path)
            others = [(str(p), e.file.policy) for p, e in chosen.items()]
            errors = check_policy_set([*others, (source, entry.file.policy)], self.budget)
            mine = [error for error in errors if error.source == source]
            if entry.file.path not in previous or previous[entry.file.path] is not entry:
                mine += ledger_errors(source, entry.file.policy)
            if not mine:
                chosen[entry.file.path] = entry
            return mine

        # Files that keep their previous policy go first: a changed file must agree
        # with them, not the other way round.
        for fault in faults:
            if fault.path in previous:
                fault.tenant = previous[fault.path].file.policy.tenant
                admit(previous[fault.path])
        for file in files:
            old = previous.get(file.path)
            same = old is not None and old.file.version == file.version
            applied_at = old.applied_at if old is not None and same else now
            try:
                credentials = resolve_credentials(file.policy)
            except PolicyError as exc:
                errors = [exc]
            else:
                errors = admit(InForce(file, credentials, applied_at))
            if not errors:
                continue
            faults += [FileFault(file.path, error, file.policy.tenant) for error in errors]
            if old is not None:
                admit(old)
        return chosen, faults

    def _report(self, chosen: dict[Path, InForce], faults: list[FileFault]) -> None:
        """A log line per change of what is in force and per new fault (not one per
        look at the directory), and the reload counters."""
        before = {(f.path, str(f.error)) for f in self.faults}
        for fault in faults:
            metrics.POLICY_RELOADS.labels(fault.tenant, "failed").inc()
            if (fault.path, str(fault.error)) not in before:
                log.warning(
                    "policy not applied",
                    extra={
                        "tenant": fault.tenant or None,
                        "file": str(fault.path),
                        "problems": str(fault.error).splitlines(),
                        "in_force": self._version_of(chosen, fault.tenant),
                    },
                )
        old = {e.file.policy.tenant: e.file.version for e in self._in_force.values()}
        new = {e.file.policy.tenant: e.file.version for e in chosen.values()}
        for tenant, version in sorted(new.items()):
            metrics.POLICY_RELOADS.labels(tenant, "applied").inc()
            if old.get(tenant) != version:
                log.info(
                    "policy applied",
                    extra={"tenant": tenant, "version": version, "previous": old.get(tenant)},
                )
        for tenant in sorted(old.keys() - new.keys()):
            log.info("policy removed", extra={"tenant": tenant, "version": old[tenant]})

    @staticmethod
    def _version_of(chosen: dict[Path, InForce], tenant: str) -> str | None:
        found = [e.file.version for e in chosen.values() if e.file.policy.tenant == tenant]
        return found[0] if found else None

    def target(self, tenant: str, tool: str) -> HttpTarget | None:
        """Where and how requests to `tool` of `tenant` go; None without an upstream."""
        return self._targets.get((tenant, tool))

    def mcp_upstream(self, tenant: str, tool: str) -> McpUpstream | None:
        """The tenant's MCP server `tool`; None if it has no such server."""
        return self._mcp.get((tenant, tool))

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
        (`feed.watched`), it does both for every host (gateway/fleetwatch.py: it
        announces an epoch that moved unannounced, bumps it for a version that moved
        unbumped), and this host reads the store only when told."""
        rotated = _secret_files_signature(self._written.values()) != self._secret_files
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
        self, ledger: Ledger, tenant: str, text: str, base: int | None, origin: str
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
        for _ in range(EDIT_ATTEMPTS):
            record = (await ledger.policies.records([tenant])).get(tenant)
            current = record.version if record is not None else 0
            if base is None:
                raise policy_changes.base_required(current)
            merged = text
            if record is not None and base != current:
                merged = await self._merged(ledger, tenant, text, base, record)
            elif record is None and base != 0:
                raise policy_changes.unknown_version(base, current)
            self._check_upload(target, load_policy_text(merged, f"uploaded policy of {tenant}"))
            result = await ledger.policies.put(
                tenant, expected=current, digest=policy_version(merged), text=merged, origin=origin
            )
            if not result.won:
                continue
            try:
                await self.apply(ledger)
            except LedgerUnavailable as exc:
                log.warning(
                    "policy stored; its limits are written at the next look",
                    extra={"tenant": tenant, "version": result.version, "why": str(exc)},
                )
                return Uploaded(policy, result.version, limits_pending=True)
            return Uploaded(self.policies.get(tenant, policy), result.version)
        raise policy_changes.busy(current)

    @staticmethod
    async def _merged(
        ledger: Ledger, tenant: str, text: str, base: int, record: PolicyRecord
    ) -> str:
        """`text`, made from version `base`, as a change of `record` (the store's
        newer version): its changed fields written over `record`'s."""
        if base > record.version or base < 1:
            raise policy_changes.unknown_version(base, record.version)
        made_from = await ledger.policies.version(tenant, base)
        if made_from is None:
            raise policy_changes.version_forgotten(base, record.version, POLICY_HISTORY)
        source = f"uploaded policy of {tenant}"
        merged, overridden = merge_edit(made_from.text, text, record.text, source)
        if overridden:
            raise policy_changes.contended(base, record.version, overridden)
        return merged

    def _check_upload(self, target: Path, policy: TenantPolicy) -> None:
        """Valid alone is not enough: it must agree with the other policies in force
        (no token shared with another tenant's agent), or no host would serve it
        while the upload was answered applied."""
        others = [(str(p), e.file.policy) for p, e in self._in_force.items() if p != target]
        errors = check_policy_set([*others, (str(target), policy)], self.budget)
        errors += ledger_errors(str(target), policy)
        if errors:
            raise PolicyLoadError(errors)

    def file_of(self, tenant: str) -> Path:
        """The file that holds (or would hold) `tenant`'s policy."""
        for path in policy_files(self.directory):
            try:
                if load_policy_text(path.read_text(encoding="utf-8"), str(path)).tenant == tenant:
                    return path
            except ValueError:
                continue
        return self.directory / f"{tenant}.yaml"


def _store_source(record: PolicyRecord) -> str:
    return f"the policy store's version {record.version} of {record.tenant}"


def _behind(path: Path, record: PolicyRecord) -> dict[str, object]:
    written = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.stamp_ms / 1000))
    return {
        "tenant": record.tenant,
        "file": str(path),
        "store_version": record.version,
        "digest": record.digest,
        "written": written,
        "by": record.origin,
        "note": "every host serves the store's version; what is edited in this file is "
        "applied field by field; `irrev policy pull` brings the store's version here",
    }


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
    policies: Iterable[TenantPolicy],
    credentials: dict[str, dict[str, Injected]],
    supervision: Supervision,
) -> dict[tuple[str, str], McpUpstream]:
    """Each MCP server of each tenant: over HTTP with its credentials as headers, or
    over stdio (a process of this worker's, not started yet) with them in its
    environment; and the tools whose `isError` means "not executed" (route field
    `is_error`). The MCP SDK is imported only where a tenant has an MCP server (it is
    most of a worker's import time)."""
    policies = list(policies)
    if not any(tool.is_mcp for policy in policies for tool in policy.document.tools.values()):
        return {}
    from .mcp_stdio import Command, StdioConnection
    from .mcp_upstream import Connection, HttpConnection, McpUpstream

    upstreams = {}
    for policy in policies:
        for name, tool in policy.document.tools.items():
            injected = credentials.get(policy.tenant, {}).get(name, ())
            connection: Connection
            if tool.mcp is not None:
                connection = HttpConnection(tool.mcp, injected)
            elif tool.mcp_command is not None:
                command = Command(tuple(tool.mcp_command), injected, tool.mcp_cwd)
                connection = StdioConnection(command, f"{policy.tenant}/{name}", supervision)
            else:
                continue
            not_executed = frozenset(
                route.template.text.removeprefix("/")
                for route in policy.catalog.by_tool.get(name, ())
                if policy.document.routes[route.index].is_error is McpErrorMeaning.NOT_EXECUTED
            )
            upstreams[(policy.tenant, name)] = McpUpstream(connection, not_executed, tool.dedupes)
    return upstreams


async def _retire(upstreams: list[McpUpstream], grace_s: float) -> None:
    """Close retired MCP servers (an HTTP client, a stdio server's process) once the
    deliveries through them have ended, at most `grace_s` (fire() gives one at most
    upstream_timeout_s); at once if cancelled."""
    await asyncio.gather(*(u.retire(grace_s) for u in upstreams), return_exceptions=True)


def _secret_files_signature(policies: Iterable[TenantPolicy]) -> tuple[tuple[str, int, int], ...]:
    paths = {
        secret.file
        for policy in policies
        for tool in policy.document.tools.values()
        for secret in [*tool.credentials.values(), *tool.mcp_env.values()]
        if isinstance(secret, SecretSource) and secret.file
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


def factor_accounts(policy: TenantPolicy, accounts: Iterable[str]) -> list[AccountSpec]:
    """The risk-factor accounts among a hold's `accounts`, as their pattern caps them:
    the reserve opens those Redis lacks, only for a hold it keeps."""
    factors = (a.removeprefix(FACTOR_PREFIX) for a in accounts if a.startswith(FACTOR_PREFIX))
    specs = (factor_account(policy, factor) for factor in factors)
    return [ledger_account(spec) for spec in specs if spec is not None]
