"""Field-by-field merge of policy documents (parsed YAML), without I/O.

A policy change is made from some version (its base): a file as a host last read
it, or the store's version an upload names in If-Match. What the change means is
what differs between that base and the edited document, field by field; applied
onto the store's current version, it changes those fields and nothing else, so a
stale copy edited for one reason (a revoked token) never puts back the other fields
it still holds (an old limit). Mappings are merged key by key; anything else (a
number, a string, a list) is one field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Path = tuple[Any, ...]
# A field the change removes (distinct from a field set to null).
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class Merged:
    """`document`: the current version with the change's fields applied. `overridden`:
    fields the change sets that also changed between its base and the current version,
    to other values (another writer's change, replaced by this one)."""

    document: dict[str, Any]
    overridden: list[str]


def changes(base: object, edited: object) -> dict[Path, object]:
    """The fields `edited` sets differently from `base`: path -> new value (_ABSENT
    where it removes the field). Equal documents have no changes."""
    found: dict[Path, object] = {}
    _diff(base, edited, (), found)
    return found


def _diff(base: object, edited: object, at: Path, found: dict[Path, object]) -> None:
    if isinstance(base, Mapping) and isinstance(edited, Mapping):
        for key in base.keys() | edited.keys():
            _diff(base.get(key, _ABSENT), edited.get(key, _ABSENT), (*at, key), found)
    elif base != edited or type(base) is not type(edited):
        found[at] = edited


def _get(document: object, path: Path) -> object:
    for key in path:
        if not isinstance(document, Mapping) or key not in document:
            return _ABSENT
        document = document[key]
    return document


def merge_documents(base: object, edited: object, current: object) -> Merged:
    """`current` with the changes from `base` to `edited` applied. Where the change
    and `current` disagree about a field both changed since `base`, the change wins
    and the field is listed in `overridden` (the caller decides whether that is a
    refusal: an upload naming an old version, or a person's newer edit of a file)."""
    if not all(isinstance(d, Mapping) for d in (base, edited, current)):
        raise ValueError("a policy must be a YAML mapping (key: value)")
    document: dict[str, Any] = _copy(current)
    overridden = []
    for path, value in sorted(changes(base, edited).items(), key=lambda c: str(c[0])):
        now = _get(current, path)
        if now != _get(base, path) and now != value:
            overridden.append(".".join(map(str, path)))
        _set(document, path, value)
    return Merged(document, overridden)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    return value


def _set(document: dict[str, Any], path: Path, value: object) -> None:
    *parents, last = path
    node = document
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            if value is _ABSENT:
                return  # removing a field under one the current version lacks
            child = node[key] = {}
        node = child
    if value is _ABSENT:
        node.pop(last, None)
    else:
        node[last] = _copy(value)
