"""An agent's `suspended` field set or removed in a policy's YAML text, for the
change `POST .../agents/{agent}/suspend` and `/resume` write (gateway/routes/
admin_agents.py). The text is edited by one line where its layout allows, so the
comments and layout people wrote stay in the store's version they read and edit
next; where it does not (flow style, a suspension written by hand over several
lines), it is written whole from the parsed document, and only its comments are
lost. Either way the result is checked to parse to exactly the intended document."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from pricing import PolicyError, parse_yaml


class UnknownAgent(LookupError):
    """The policy has no such agent: name one of its `agents`."""


def agent_fields(text: str, source: str, agent: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parsed policy and its agent's mapping (UnknownAgent if it has none)."""
    document = parse_yaml(text, source)
    agents = document.get("agents") if isinstance(document, dict) else None
    entry = agents.get(agent) if isinstance(agents, dict) else None
    if not isinstance(document, dict) or not isinstance(entry, dict):
        raise UnknownAgent(f"the policy has no agent {agent!r}: name one of its agents")
    return document, entry


def with_suspension(text: str, source: str, agent: str, suspension: dict[str, str] | None) -> str:
    """`text` with `agents.<agent>.suspended` set to `suspension` (None: removed)."""
    document, entry = agent_fields(text, source, agent)
    if suspension is None:
        entry.pop("suspended", None)
    else:
        entry["suspended"] = suspension
    edited = _line_edit(text, agent, suspension)
    if edited is not None and _parsed(edited, source) == document:
        return edited
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def _parsed(text: str, source: str) -> object:
    """The edit as parsed; None where it is no YAML (an edit that cannot be used)."""
    try:
        return parse_yaml(text, source)
    except PolicyError:
        return None


def _line_edit(text: str, agent: str, suspension: dict[str, str] | None) -> str | None:
    """The one-line edit: `suspended: {...}` (JSON, which YAML reads as a flow
    mapping) as the agent's first field, or that field removed; None where the
    agent's entry is not a block mapping whose fields are indented below its key.
    The caller checks the result, so a key of the same name elsewhere can only make
    it fall back, never write the wrong place."""
    lines = text.splitlines(keepends=True)
    head = re.compile(rf"^( +){re.escape(agent)}:[ \t]*(#.*)?$")
    at = next((i for i, line in enumerate(lines) if head.match(line.rstrip("\r\n"))), None)
    if at is None:
        return None
    indent = len(lines[at]) - len(lines[at].lstrip(" "))
    fields = []
    for i in range(at + 1, len(lines)):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            continue
        if len(lines[i]) - len(lines[i].lstrip(" ")) <= indent:
            break
        fields.append(i)
    if not fields:
        return None
    child = " " * (len(lines[fields[0]]) - len(lines[fields[0]].lstrip(" ")))
    if suspension is not None:
        line = f"{child}suspended: {json.dumps(suspension, ensure_ascii=False)}\n"
        return "".join([*lines[: at + 1], line, *lines[at + 1 :]])
    found = [i for i in fields if lines[i].startswith(f"{child}suspended:")]
    if not found:
        return None
    # The field's own line and its block's, if written as a block mapping: the agent's
    # field lines after it indented deeper, up to its next field.
    end = found[0] + 1
    for i in fields[fields.index(found[0]) + 1 :]:
        if not lines[i].startswith(f"{child} "):
            break
        end = i + 1
    return "".join(lines[: found[0]] + lines[end:])
