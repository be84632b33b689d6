"""The field-by-field merge of a policy change onto the store's newer version."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pricing.merge import changes, merge_documents

BASE: dict[str, Any] = {
    "tenant": "acme",
    "accounts": {"tenant": {"limit": "250000"}, "principals": {"ops": {"limit": "10"}}},
    "agents": {"buyer": {"token_sha256": "sha256:aa", "routes": ["a", "b"]}},
}


def edited(**paths: object) -> dict[str, object]:
    """BASE with `paths` (dotted, '__' for '.') set; None removes the field."""
    document = copy.deepcopy(BASE)
    for dotted, value in paths.items():
        *parents, last = dotted.split("__")
        node: dict[str, Any] = document
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    return document


def test_equal_documents_have_no_changes() -> None:
    assert changes(BASE, edited()) == {}


def test_a_change_of_one_field_leaves_the_others_of_the_newer_version() -> None:
    """A stale copy (limit 250,000) edited to revoke a token: the store's newer limit
    stays; only the token is written."""
    current = edited(accounts__tenant__limit="177777")
    change = edited(agents__buyer__token_sha256="sha256:bb")
    merged = merge_documents(BASE, change, current)
    assert merged.document["accounts"]["tenant"]["limit"] == "177777"
    assert merged.document["agents"]["buyer"]["token_sha256"] == "sha256:bb"
    assert merged.overridden == []


def test_a_field_both_changed_is_the_changes_and_is_named() -> None:
    current = edited(accounts__tenant__limit="188888")
    change = edited(accounts__tenant__limit="177777")
    merged = merge_documents(BASE, change, current)
    assert merged.document["accounts"]["tenant"]["limit"] == "177777"
    assert merged.overridden == ["accounts.tenant.limit"]


def test_the_same_value_set_by_both_is_no_override() -> None:
    current = edited(accounts__tenant__limit="177777")
    merged = merge_documents(BASE, edited(accounts__tenant__limit="177777"), current)
    assert merged.overridden == []


def test_removals_and_additions_are_changes_of_their_own_fields() -> None:
    current = edited(accounts__principals__ops__limit="20")
    change = edited(agents__buyer=None, agents__seller={"token_sha256": "sha256:cc"})
    merged = merge_documents(BASE, change, current)
    assert set(merged.document["agents"]) == {"seller"}
    assert merged.document["accounts"]["principals"]["ops"]["limit"] == "20"


def test_a_list_is_one_field() -> None:
    current = edited(agents__buyer__routes=["a"])
    merged = merge_documents(BASE, edited(agents__buyer__routes=["a", "b", "c"]), current)
    assert merged.document["agents"]["buyer"]["routes"] == ["a", "b", "c"]
    assert merged.overridden == ["agents.buyer.routes"]


def test_a_field_removed_meanwhile_and_changed_here_comes_back_as_changed() -> None:
    current = edited(agents__buyer=None)
    merged = merge_documents(BASE, edited(agents__buyer__routes=["z"]), current)
    assert merged.document["agents"]["buyer"] == {"routes": ["z"]}
    assert merged.overridden == ["agents.buyer.routes"]


def test_what_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="mapping"):
        merge_documents(BASE, ["not", "a", "policy"], BASE)
