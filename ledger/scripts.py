"""Loads the Lua scripts: each operation's file, prefixed with the shared `_lib.lua`,
registered once and run by EVALSHA with a fallback to EVAL after NOSCRIPT (redis-py's
Script does that)."""

from __future__ import annotations

from importlib.resources import files

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

OPERATIONS = (
    "reserve",
    "post",
    "void",
    "ambiguous",
    "compensate",
    "approve",
    "reject",
    "expire",
    "sweep",
    "account",
)


def script_source(operation: str) -> str:
    package = files("ledger.lua")
    library = package.joinpath("_lib.lua").read_text(encoding="utf-8")
    return library + "\n" + package.joinpath(f"{operation}.lua").read_text(encoding="utf-8")


def register_scripts(redis: Redis) -> dict[str, AsyncScript]:
    return {name: redis.register_script(script_source(name)) for name in OPERATIONS}
