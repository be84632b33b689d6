"""The Lua of the ledger, in the two forms Redis runs it.

On Redis 7: one Redis Functions library (`function_library`), the shared `_lib.lua`
followed by one function per operation, loaded with FUNCTION LOAD REPLACE and called
with FCALL. Redis keeps a library in its data (replicated, persisted, kept across a
restart and a failover) and builds the helpers once at load, not on every call. The
library's name and its functions' names carry a digest of its code, so gateways of
two versions of irrev share a Redis during an upgrade, each calling its own.

On Redis 6.2 (no Functions): each operation's file prefixed with the parts of
`_lib.lua` it uses (`script_source`), run by EVALSHA. A script's top-level code runs
on every call, so each `local function` it carries is a closure built on every
call: `script_source` keeps only the library's statements that the operation names,
directly or through other kept statements (statements that define nothing are
always kept), in the library's order. For the same reason the library's caches
would be built and dropped on every call: `_eval.lua`'s statements take the place
of the library's of the same names (`remembering` makes no cache there), chosen
here once, not on every call.

Every operation of a tenant's ledger (OPERATIONS, including the approval loop's
note, rule and webhook) is in the library, so its digest versions all of them.
lease.lua, lease_release.lua, watch.lua (ledger/lease.py), policy_put.lua
(ledger/policystore.py), keys.lua (ledger/keystore.py), epoch.lua
(ledger/changes.py) and refusals.lua (ledger/refusals.py) stay plain EVALSHA
scripts on purpose: they use nothing of `_lib.lua` and their keys are not a tenant's
ledger keys (`bind` would name the lease, the policy record, the managed keys or the
refusal counts the accounts hash), they run once per lease period, policy or key
write or flush of counts
(FCALL's saved setup is worth nothing there), and a script's SHA is already the
digest of its own code, so gateways of two versions never run each
other's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

OPERATIONS = (
    "reserve",
    "post",
    "void",
    "ambiguous",
    "retry",
    "compensate",
    "trueup",
    "learn",
    "calibrate",
    "approve",
    "reject",
    "expire",
    "sweep",
    "account",
    "note",
    "rule",
    "webhook",
    "pools",
    "attach",
    "close",
    "rate",
    "detector",
    "shrink",
    "archive",
    "restore",
    "escrow",
    "escrow_shard",
)

# How many of the tenant's KEYS[1..5] (accounts, journal, deadlines, ambiguous,
# escalated) each operation takes: `bind` checks them (5 unless named here).
_STANDARD_KEYS = {
    "account": 2,
    "rule": 2,
    "webhook": 2,
    "attach": 1,
    "close": 2,
    "rate": 1,
    "detector": 2,
    "archive": 1,
    "restore": 1,
    "escrow": 2,
    "escrow_shard": 2,
}

# Operations that can also run several calls in one (`<operation>_group`, _lib.lua's
# `grouped`): a tenant's concurrent reserves and posts, coalesced (ledger/group.py).
GROUPED = ("reserve", "post")
GROUP_OPERATIONS = tuple(f"{operation}_group" for operation in GROUPED)

# Scripts of ledger/lua run outside the library (see above), by their own modules.
PLAIN_SCRIPTS = ("epoch", "keys", "lease", "lease_release", "policy_put", "refusals", "watch")

_DEFINES = re.compile(r"local\s+(?:function\s+)?([A-Za-z_]\w*)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"--.*$", re.MULTILINE)


def _read(name: str) -> str:
    return files("ledger.lua").joinpath(name).read_text(encoding="utf-8")


def _statements(library: str) -> list[tuple[str | None, str]]:
    """The library's top-level statements as (defined name or None, text); comment
    lines go with the statement after them."""
    statements: list[tuple[str | None, str]] = []
    pending: list[str] = []
    for line in library.splitlines(keepends=True):
        starts = bool(line) and not line[0].isspace() and not line.startswith(("--", "end"))
        if starts:
            match = _DEFINES.match(line)
            statements.append((match.group(1) if match else None, "".join(pending) + line))
            pending = []
        elif line.startswith("--") or not statements or pending:
            pending.append(line)
        else:
            name, text = statements[-1]
            statements[-1] = (name, text + line)
    if pending:
        statements.append((None, "".join(pending)))
    return statements


def _names(text: str) -> set[str]:
    return set(_NAME.findall(_COMMENT.sub("", text)))


# What every script keeps of the library: the call's keys and arguments (`bind`).
_ALWAYS = frozenset({"KEYS", "bind"})
_VERSION = "IRREV_VERSION"


@cache
def _evalsha_statements() -> list[tuple[str | None, str]]:
    """_lib.lua's statements with those `_eval.lua` defines in their place."""
    instead = {name: text for name, text in _statements(_read("_eval.lua")) if name}
    statements = [
        (name, instead.pop(name) if name in instead else text)
        for name, text in _statements(_read("_lib.lua"))
    ]
    if instead:
        raise ValueError(f"_eval.lua defines {sorted(instead)}, which _lib.lua does not")
    return statements


def _group_body(operation: str, keys: str, argv: str) -> str:
    """A `<operation>_group` call: the operation's file as the function `grouped` runs
    once per call of the group."""
    standard = _STANDARD_KEYS.get(operation, 5)
    return (
        f"return grouped({keys}, {argv}, {standard}, function()\n"
        f"{_read(f'{operation}.lua')}\nend)\n"
    )


@cache
def script_source(operation: str) -> str:
    """The EVALSHA form of `operation` (Redis 6.2)."""
    statements = _evalsha_statements()
    grouped = operation.removesuffix("_group") if operation in GROUP_OPERATIONS else None
    body = _group_body(grouped, "_KEYS", "_ARGV") if grouped else _read(f"{operation}.lua")
    needed = _names(body) | _ALWAYS
    keep = [name is None for name, _ in statements]
    changed = True
    while changed:
        changed = False
        for i, (name, text) in enumerate(statements):
            if not keep[i] and name in needed:
                keep[i] = changed = True
                needed |= _names(text)
    library = "".join(text for (_, text), kept in zip(statements, keep, strict=True) if kept)
    # Redis 6 needs replicate_commands() to write after TIME (7 always replicates
    # effects). The library's KEYS and ARGV shadow the globals, so they are taken
    # before it and bound after it.
    binding = "" if grouped else f"bind(_KEYS, _ARGV, {_STANDARD_KEYS.get(operation, 5)})\n"
    return (
        f"redis.replicate_commands()\nlocal _KEYS, _ARGV = KEYS, ARGV\n{library}\n{binding}{body}"
    )


@dataclass(frozen=True, slots=True)
class Library:
    """The Functions form of the ledger (Redis 7): `code` for FUNCTION LOAD, and the
    name of each operation's function, by operation."""

    name: str
    code: str
    functions: dict[str, str]


@cache
def function_library() -> Library:
    parts = [f"#!lua name=irrev_{_VERSION}\n", _read("_lib.lua")]
    for operation in OPERATIONS:
        parts.append(
            f"\nredis.register_function('irrev_{_VERSION}_{operation}', function(keys, argv)\n"
            f"bind(keys, argv, {_STANDARD_KEYS.get(operation, 5)})\n"
            f"{_read(f'{operation}.lua')}\nend)\n"
        )
    for operation in GROUPED:
        parts.append(
            f"\nredis.register_function('irrev_{_VERSION}_{operation}_group', "
            f"function(keys, argv)\n{_group_body(operation, 'keys', 'argv')}end)\n"
        )
    code = "".join(parts)
    version = hashlib.sha1(code.encode()).hexdigest()[:12]
    return Library(
        f"irrev_{version}",
        code.replace(_VERSION, version),
        {
            operation: f"irrev_{version}_{operation}"
            for operation in (*OPERATIONS, *GROUP_OPERATIONS)
        },
    )
