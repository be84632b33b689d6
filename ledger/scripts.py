"""Loads the Lua scripts: each operation's file, prefixed with the parts of the shared
`_lib.lua` it uses, registered once and run by EVALSHA with a fallback to EVAL after
NOSCRIPT (redis-py's Script does that).

A script's top-level code runs on every call, so each `local function` of the
library it carries is a closure built on every call: prefixing the whole library
cost every script ~3 us of Redis time. `script_source` therefore keeps only the
library's statements that the operation names, directly or through other kept
statements (statements that define nothing, such as `redis.replicate_commands()`,
are always kept), in the library's order.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

from redis.commands.core import AsyncScript

from .cluster import RedisClient

OPERATIONS = (
    "reserve",
    "post",
    "void",
    "ambiguous",
    "retry",
    "compensate",
    "trueup",
    "learn",
    "approve",
    "reject",
    "expire",
    "sweep",
    "account",
    "note",
    "rule",
    "webhook",
)

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


@cache
def script_source(operation: str) -> str:
    statements = _statements(_read("_lib.lua"))
    body = _read(f"{operation}.lua")
    needed = _names(body)
    keep = [name is None for name, _ in statements]
    changed = True
    while changed:
        changed = False
        for i, (name, text) in enumerate(statements):
            if not keep[i] and name in needed:
                keep[i] = changed = True
                needed |= _names(text)
    library = "".join(text for (_, text), kept in zip(statements, keep, strict=True) if kept)
    return library + "\n" + body


def register_scripts(redis: RedisClient) -> dict[str, AsyncScript]:
    return {name: redis.register_script(script_source(name)) for name in OPERATIONS}
