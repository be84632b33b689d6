"""A tenant's policy between this host's files and the fleet's policy store
(docs/design.md, "Policy changes"): which file is usable, what was edited in one and
is written into the store, which version of the store is served, and the accounts a
served version names written to Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gateway.edge import metrics
from gateway.state import policy_changes
from gateway.state.credentials import Injected, resolve_credentials
from gateway.state.policies import (
    FileFault,
    ForwardBudget,
    PolicyFile,
    PolicyLoadError,
    check_policy_set,
    ledger_errors,
    merge_edit,
    policy_version,
)
from gateway.state.policy_changes import StoreVersion
from ledger import POLICY_HISTORY, Ledger, PolicyRecord, TenantEscrowed
from ledger import AccountSpec as LedgerAccount
from pricing import Finding, PolicyError, TenantPolicy, load_policy_text

log = logging.getLogger("irrev.gateway")

# Account changes in flight at once: enough to open a new tenant's accounts quickly,
# few enough to leave the connection pool to the admission path.
OPENING_CONCURRENCY = 8

# Compare-and-set attempts of one policy change before it is given up (a file's edit
# is then tried again at the next look; an upload is answered 409).
EDIT_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class InForce:
    """A tenant's policy file in force: the policy as written, its digest, when it
    was applied (Unix time), its tools' credentials as resolved then, and its
    version in the fleet's policy store (0 until the store has it)."""

    file: PolicyFile
    credentials: dict[str, Injected]
    applied_at: float
    version: int = 0


async def open_accounts(
    ledger: Ledger, accounts: list[tuple[str, LedgerAccount, int]]
) -> tuple[int, set[str]]:
    """Create each account Redis lacks, and write the limits of each whose limits come
    from an older version of its tenant's policy than the one served here (tenant,
    spec, store version). The version goes with the write (account.lua keeps an
    account's newer limits): two hosts that write two versions' limits in the wrong
    order leave the newer ones, and a host still serving an older version writes
    nothing. Every host that serves a version writes what is missing of it, so
    limits left unwritten by a writer that died are written by the next host to
    apply. What Redis holds is read in one pipelined round trip; the accounts to
    write are written a few at a time; the first error is raised once all have
    finished, but for a tenant split over escrow shards (TenantEscrowed: its limits
    are the escrow's, which this gateway does not route to). Returns how many were
    written, and the tenants refused as escrowed."""
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

    async def upsert(tenant: str, spec: LedgerAccount, version: int) -> None:
        async with gate:
            await ledger.upsert_account(tenant, spec, policy_version=version)

    results = await asyncio.gather(
        *(upsert(tenant, spec, version) for tenant, spec, version in changes),
        return_exceptions=True,
    )
    escrowed = {
        tenant
        for (tenant, _, _), result in zip(changes, results, strict=True)
        if isinstance(result, TenantEscrowed)
    }
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, TenantEscrowed):
            raise result
    return len(changes), escrowed


def escrowed_faults(chosen: dict[Path, InForce], escrowed: set[str]) -> list[FileFault]:
    """Take the policies of tenants split over escrow shards out of `chosen`: the
    gateway does not route a tenant's holds to its shards, and an account written
    beside them would hold budget outside the escrow (refused by the ledger), so such
    a tenant is not served. Each is its file's fault, for the operator to see."""
    faults = []
    for path, entry in list(chosen.items()):
        tenant = entry.file.policy.tenant
        if tenant in escrowed:
            del chosen[path]
            finding = Finding(
                "tenant",
                f"{tenant!r} is split over escrow shards (ledger/escrow.py), which this "
                "gateway does not route to: it is not served",
            )
            faults.append(FileFault(path, PolicyError(str(path), [finding]), tenant))
    return faults


def choose(
    files: list[PolicyFile],
    faults: list[FileFault],
    previous: dict[Path, InForce],
    budget: ForwardBudget,
) -> tuple[dict[Path, InForce], list[FileFault]]:
    """Which policy each file puts in force: the file as it is now if it loads and
    agrees with everything already chosen, else the policy it had before (`previous`)."""
    now = time.time()
    chosen: dict[Path, InForce] = {}

    def admit(entry: InForce) -> list[PolicyError]:
        source = str(entry.file.path)
        others = [(str(p), e.file.policy) for p, e in chosen.items()]
        errors = check_policy_set([*others, (source, entry.file.policy)], budget)
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


async def take_in(
    ledger: Ledger, instance: str, local: dict[Path, InForce], records: dict[str, PolicyRecord]
) -> list[FileFault]:
    """Put into the store what was edited in this host's files (`local`: those read
    now that are usable here; a file that is not keeps its tenant on the policy
    it had, and is taken in once it is) (docs/design.md, "Policy changes"). The
    store remembers what each file (its source: this gateway's instance name,
    IRREV_INSTANCE (`instance`), and the file's path) held when this gateway last acted on it;
    an edit is what differs from that, field by field, and only those fields are
    written, over the store's current version
    (pricing/merge.py). A file the store already has, or that has not changed
    since, writes nothing: a stale copy changes nothing by being there, being
    touched or being served to a restarted host. A file seen for the first time
    while the store holds another version is recorded, not applied (its
    differences are not an edit anyone made here). A tenant the store lacks
    takes the file as it is. `records` is updated with what was written."""
    faults: list[FileFault] = []
    sources = {path: f"{instance}:{path.resolve()}" for path in local}
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
            records[tenant] = await _write_edit(ledger, entry, source, base, record)
        except PolicyError as exc:
            faults.append(FileFault(path, exc, tenant))
    return faults


async def _write_edit(
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
        result = await ledger.policies.put(
            tenant,
            expected=record.version if record is not None else 0,
            expected_digest=record.digest if record is not None else "",
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


def serve_store(
    local: dict[Path, InForce],
    records: dict[str, PolicyRecord],
    previous: dict[Path, InForce],
    behind_logged: dict[Path, str],
    budget: ForwardBudget,
) -> tuple[dict[Path, InForce], list[FileFault], dict[Path, str]]:
    """What is served for each tenant this host has a file of: the store's version.
    A file that differs from it is reported (it is not in force here); a stored
    version this host cannot use (it does not load, its credentials are missing
    here, or it disagrees with the others in force) leaves the tenant on the
    policy it had, or, with none (a host that just started), unserved: its own
    copy is not the store's version. A file that differs from the store's version
    is no fault: the store is the truth, and what is edited in the file is taken
    in (`take_in`); it is logged once per version (`behind_logged`: the digest
    each file was logged as differing from; the new such map is returned)."""
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
        if behind_logged.get(path) != record.digest:
            log.info("policy file differs from the store", extra=_behind(path, record))
        behind[path] = record.digest
        old = previous.get(path)
        if old is not None and old.file.version == record.digest:
            # The same text may come back under a newer number (a revert): served
            # under the old one, its limits would be kept out by a version between.
            chosen[path] = replace(old, version=record.version)
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
            # Not this host's own copy: it is older than the store's version, and
            # served it could let in again what that version took out.
            if old is not None:
                chosen[path] = old
            continue
        chosen[path] = candidate
    faults += _set_faults(chosen, local, records, previous, budget)
    return chosen, faults, behind


def _set_faults(
    chosen: dict[Path, InForce],
    local: dict[Path, InForce],
    records: dict[str, PolicyRecord],
    previous: dict[Path, InForce],
    budget: ForwardBudget,
) -> list[FileFault]:
    """Take out of `chosen` each store version that disagrees with the others in force
    (a shared token, a tenant defined twice), for the policy its tenant had here, or
    for its file if the store has none of the tenant, or for nothing; its faults."""
    faults = []
    for error in check_policy_set([(str(p), e.file.policy) for p, e in chosen.items()], budget):
        path = Path(error.source)
        failing = chosen.get(path)
        kept = previous.get(path)
        if kept is None and path in local and local[path].file.policy.tenant not in records:
            kept = local[path]
        if failing is not None and failing is not kept:
            faults.append(FileFault(path, error, failing.file.policy.tenant))
            if kept is None:
                del chosen[path]
            else:
                chosen[path] = kept
    return faults


def report(
    previous: dict[Path, InForce],
    previous_faults: list[FileFault],
    chosen: dict[Path, InForce],
    faults: list[FileFault],
) -> None:
    """A log line per change of what is in force and per new fault (not one per
    look at the directory), and the reload counters."""
    before = {(f.path, str(f.error)) for f in previous_faults}
    for fault in faults:
        metrics.POLICY_RELOADS.labels(fault.tenant, "failed").inc()
        if (fault.path, str(fault.error)) not in before:
            log.warning(
                "policy not applied",
                extra={
                    "tenant": fault.tenant or None,
                    "file": str(fault.path),
                    "problems": str(fault.error).splitlines(),
                    "in_force": _version_of(chosen, fault.tenant),
                },
            )
    old = {e.file.policy.tenant: e.file.version for e in previous.values()}
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


def _version_of(chosen: dict[Path, InForce], tenant: str) -> str | None:
    found = [e.file.version for e in chosen.values() if e.file.policy.tenant == tenant]
    return found[0] if found else None


async def merged_upload(
    ledger: Ledger, tenant: str, text: str, base: StoreVersion, record: PolicyRecord
) -> str:
    """`text`, made from version `base`, as a change of `record` (the store's
    newer version): its changed fields written over `record`'s. A `base` whose
    number the store holds under another digest is one it never held (a failover
    lost it): what the change was made from is unknown, so nothing can be merged."""
    current = StoreVersion(record.version, record.digest)
    if base.number > record.version or base.number < 1:
        raise policy_changes.unknown_version(base, current)
    made_from = await ledger.policies.version(tenant, base.number)
    if made_from is None:
        raise policy_changes.version_forgotten(base, current, POLICY_HISTORY)
    if made_from.digest != base.digest:
        raise policy_changes.unknown_version(base, current)
    source = f"uploaded policy of {tenant}"
    merged, overridden = merge_edit(made_from.text, text, record.text, source)
    if overridden:
        raise policy_changes.contended(base, current, overridden)
    return merged


def check_upload(
    in_force: dict[Path, InForce], target: Path, policy: TenantPolicy, budget: ForwardBudget
) -> None:
    """Valid alone is not enough: it must agree with the other policies in force
    (no token shared with another tenant's agent), or no host would serve it
    while the upload was answered applied."""
    others = [(str(p), e.file.policy) for p, e in in_force.items() if p != target]
    errors = check_policy_set([*others, (str(target), policy)], budget)
    errors += ledger_errors(str(target), policy)
    if errors:
        raise PolicyLoadError(errors)


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
