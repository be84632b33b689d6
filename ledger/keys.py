"""Redis key names: pure functions. Every key of a tenant carries the `{tenant}` hash
tag, so one script touches one slot and the same code runs on Redis Cluster; every
key a script touches is declared in its KEYS (the layout is in lua/_lib.lua)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

TENANTS_KEY = "irrev:tenants"
# Bumped on every write to the policy store (ledger/policystore.py), and on every
# compensation outcome counted (learn): gateways poll both with one MGET (one slot).
POLICY_EPOCH_KEY = "irrev:{fleet}:policy-epoch"
OUTCOMES_EPOCH_KEY = "irrev:{fleet}:outcomes-epoch"
# Bumped on every write of a managed key (ledger/keystore.py): gateways reload keys.
KEYS_EPOCH_KEY = "irrev:{fleet}:keys-epoch"
# The newest record format every gateway of the fleet reads (ledger/release.py).
RELEASE_KEY = "irrev:{fleet}:release"
# Who does the fleet-wide checks now (lua/watch.lua): one process of the fleet.
WATCH_LEASE_KEY = "irrev:{fleet}:lease:watch"


def tenant_prefix(tenant: str) -> str:
    """What every key of the tenant starts with."""
    return f"irrev:{{{tenant}}}:"


def accounts_key(tenant: str) -> str:
    """One hash of every account of the tenant, ACCOUNT_FIELDS of each."""
    return f"{tenant_prefix(tenant)}accounts"


# The numbers of an account, each the field `<account id>|<name>` of accounts_key
# (an account id never holds a '|'); the order of lua/_lib.lua's ACCOUNT_FIELDS.
ACCOUNT_FIELDS = ("limit", "soft", "win", "appr", "pend", "post", "ws", "over")


def account_fields(account: str) -> list[str]:
    return [f"{account}|{name}" for name in ACCOUNT_FIELDS]


def hold_key(tenant: str, hold_id: str) -> str:
    return f"{tenant_prefix(tenant)}hold:{hold_id}"


def payload_key(tenant: str, hold_id: str) -> str:
    """The bytes a hold keeps beside its record (a string): the request while it is
    live (or rejected or expired), the upstream's answer (the outcome) once it is
    posted or voided. In the record, one value over 64 bytes makes Redis store the
    whole hash as a table, about three times the memory, for the rest of the hold's
    life. Not under `hold:`, whose ids may end in anything a key could
    (`hold:<id>:payload` would be the record of hold `<id>:payload`)."""
    return f"{tenant_prefix(tenant)}payload:{hold_id}"


def kept_answers_key(tenant: str, agent: str) -> str:
    """The bytes of answers kept whole for `agent`'s repeats in the current UTC day
    (a count that expires at the day's end), which post.lua and void.lua keep within
    the agent's allowance (kept_within in lua/_lib.lua)."""
    return f"{tenant_prefix(tenant)}kept:{agent}"


# The scripts whose ARGV[4] names the agent whose allowance of kept answer bytes
# their outcome is kept within ('' for none): that agent's count is their KEYS[8].
SETTLING = frozenset({"post", "void"})
SETTLING_AGENT = 3


def settling_keys(keys: list[str], tenant: str, operation: str, args: Sequence[str]) -> list[str]:
    """`keys` of a script about one hold, with the agent's count of kept answer bytes
    when it is a settlement kept within an allowance (post.lua, void.lua)."""
    if operation in SETTLING and args[SETTLING_AGENT]:
        return [*keys, kept_answers_key(tenant, args[SETTLING_AGENT])]
    return keys


def content_key(tenant: str, content: str) -> str:
    """The newest generation of holds of one keyless call's content (lua/attach.lua):
    `content` is an id the gateway derives from the agent, the route and the request
    as priced."""
    return f"{tenant_prefix(tenant)}content:{content}"


def settled_key(tenant: str) -> str:
    """The tenant's settled index: hold id -> `<expiry ms>|<digest>` of each settled
    hold archived out of its slot (lua/archive.lua)."""
    return f"{tenant_prefix(tenant)}settled"


def archive_state_key(tenant: str) -> str:
    """Where the tenant's archiver is: `journal` (the last entry read), `trim` (its
    scan of the settled index)."""
    return f"{tenant_prefix(tenant)}archive"


def restored_key(tenant: str) -> str:
    """Holds brought back from the archive (lua/restore.lua): id -> Redis time."""
    return f"{tenant_prefix(tenant)}restored"


# The archived copies of a tenant's holds are spread over this many slots by id, none
# of them the tenant's: a copy is written once and read only by a replay or a
# restore, so where it lives costs the tenant's writes nothing.
ARCHIVE_BUCKETS = 16


def archive_copy_key(tenant: str, hold_id: str, digest: str) -> str:
    """The archived copy of one record of a hold (a hash: its fields, and its payload
    as ARCHIVED_PAYLOAD), named by the record's digest so that no copy is ever written
    over: its own hash tag, `{<tenant>~a<bucket>}` ('~' is in no tenant id)."""
    return f"irrev:{{{tenant}~a{archive_bucket(hold_id)}}}:hold:{hold_id}#{digest}"


def archive_bucket(hold_id: str) -> int:
    """Which of the ARCHIVE_BUCKETS slots keeps the copies of a hold."""
    return zlib.crc32(hold_id.encode()) % ARCHIVE_BUCKETS


# The field of an archived copy that keeps the hold's payload (no record field starts
# with '_').
ARCHIVED_PAYLOAD = "_payload"


def journal_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}journal"


def checkpoint_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}checkpoint"


def observed_key(tenant: str, outcome: str) -> str:
    """Compensation outcomes ('failures' or 'successes') counted per route id."""
    return f"{tenant_prefix(tenant)}observed:{outcome}"


def factors_key(tenant: str) -> str:
    """Settled residual factors per route id (calibrate.lua)."""
    return f"{tenant_prefix(tenant)}observed:factors"


def trim_lock_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}trim-lock"


def policy_key(tenant: str) -> str:
    """The tenant's policy in the fleet's store: a hash (lua/policy_put.lua)."""
    return f"{tenant_prefix(tenant)}policy"


def policy_log_key(tenant: str) -> str:
    """The tenant's policy history, newest first (lua/policy_put.lua)."""
    return f"{tenant_prefix(tenant)}policy:log"


def policy_sources_key(tenant: str) -> str:
    """What each source (a host's policy file) last read of the tenant's policy: the
    base its next edit is measured from (lua/policy_put.lua)."""
    return f"{tenant_prefix(tenant)}policy:sources"


def managed_keys_key(tenant: str) -> str:
    """The tenant's managed keys: a hash, key id -> record (lua/keys.lua)."""
    return f"{tenant_prefix(tenant)}keys"


def key_hashes_key(tenant: str) -> str:
    """The token hashes of the tenant's keys that are not revoked: hash -> key id."""
    return f"{tenant_prefix(tenant)}keys:hashes"


def keys_version_key(tenant: str) -> str:
    """The tenant's managed keys version: moved by each write to a value it never held
    (lua/keys.lua)."""
    return f"{tenant_prefix(tenant)}keys:version"


def keys_used_key(tenant: str) -> str:
    """When each of the tenant's keys was last used: key id -> Redis ms, as the
    gateways flush it (not per request)."""
    return f"{tenant_prefix(tenant)}keys:used"


def lease_key(tenant: str, work: str) -> str:
    """The lease of one kind of background work on the tenant (`sweep`, `events`):
    a string holding its holder's token (ledger/lease.py)."""
    return f"{tenant_prefix(tenant)}lease:{work}"


def deadlines_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}deadlines"


def ambiguous_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}ambiguous"


def escalated_key(tenant: str) -> str:
    return f"{tenant_prefix(tenant)}escalated"


def rules_key(tenant: str) -> str:
    """The tenant's bounded-time rules (lua/rule.lua)."""
    return f"{tenant_prefix(tenant)}rules"


def webhook_cursor_key(tenant: str) -> str:
    """The id of the last journal entry whose webhook event was delivered."""
    return f"{tenant_prefix(tenant)}webhook:cursor"


def webhook_lease_key(tenant: str) -> str:
    """Who delivers the tenant's webhook events now (one dispatcher at a time)."""
    return f"{tenant_prefix(tenant)}webhook:lease"


def escrow_key(tenant: str) -> str:
    """An escrowed tenant's transfers (lua/escrow.lua on the parent, escrow_shard.lua
    on a shard): a hash."""
    return f"{tenant_prefix(tenant)}escrow"


def escrow_seen_key(tenant: str) -> str:
    """The transfer ids a side of an escrow has received, by time: a sorted set."""
    return f"{tenant_prefix(tenant)}escrow:seen"


def shard_tenant(tenant: str, index: int, salt: int = 0) -> str:
    """The ledger tenant of escrow shard `index` of `tenant`: `<tenant>~e<index>`, with
    `x<salt>` when a salt moves it to another slot ('~' is in no tenant id)."""
    return f"{tenant}~e{index}" + (f"x{salt}" if salt else "")


def is_shard_tenant(tenant: str) -> bool:
    """Whether `tenant` is an escrow shard (shard_tenant's `~e`)."""
    return "~e" in tenant


def tenant_keys(tenant: str) -> list[str]:
    """KEYS[1..5] of every hold script: accounts, journal, deadlines, ambiguous,
    escalated (account.lua takes the first two)."""
    return [
        accounts_key(tenant),
        journal_key(tenant),
        deadlines_key(tenant),
        ambiguous_key(tenant),
        escalated_key(tenant),
    ]


def hold_keys(tenant: str, hold_id: str) -> list[str]:
    """The keys of one hold: its record, then its payload (payload_key)."""
    return [hold_key(tenant, hold_id), payload_key(tenant, hold_id)]


def hold_script_keys(tenant: str, hold_id: str) -> list[str]:
    """KEYS of a script about one hold: the tenant's five, then the hold's two."""
    return [*tenant_keys(tenant), *hold_keys(tenant, hold_id)]


def reserve_keys(tenant: str, hold_id: str) -> list[str]:
    """KEYS of reserve.lua: a hold script's, then the tenant's settled index."""
    return [*hold_script_keys(tenant, hold_id), settled_key(tenant)]


def stress_key(tenant: str) -> str:
    """The tenant's stress detectors, one per route (lua/detector.lua)."""
    return f"{tenant_prefix(tenant)}stress"


def stress_alarms_key(tenant: str, tag: str) -> str:
    """The runs of one route's detector that ended in an alarm (lua/detector.lua)."""
    return f"{tenant_prefix(tenant)}stress-alarms:{tag}"


def margins_key(tenant: str) -> str:
    """The holds that keep a stress margin until their detector vouches for them:
    members `<route tag>|<run>|<calm price>|<hold id>` (gateway/state/margins.py)."""
    return f"{tenant_prefix(tenant)}margins"


def refusals_prefix(tenant: str) -> str:
    """What every key of the tenant's refusal counts starts with."""
    return f"{tenant_prefix(tenant)}refusals:"


def refusals_key(tenant: str, minute: int) -> str:
    """The tenant's refusal counts of one minute (minutes since the epoch, Redis's
    clock): a hash `<reason>|<transport>|<agent>|<route>` -> count (lua/refusals.lua)."""
    return f"{refusals_prefix(tenant)}{minute}"
