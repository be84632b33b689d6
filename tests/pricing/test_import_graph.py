"""pricing/'s modules import each other without a cycle: the document (policy.py) is
below everything compiled from it, and no import hides in a function or behind
TYPE_CHECKING to dodge one. Every import statement anywhere in a module counts."""

from __future__ import annotations

import ast
from pathlib import Path

import pricing

PRICING_DIR = Path(pricing.__file__).parent
MODULES = {p.stem: p for p in PRICING_DIR.glob("*.py") if p.stem != "__init__"}

Graph = dict[str, set[str]]


def imported_pricing_modules(source: str) -> set[str]:
    """Modules of pricing/ that `source` imports, at any depth of the syntax tree."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            prefix = f"pricing.{node.module}" if node.module else "pricing"
            names = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "pricing" and len(parts) > 1 and parts[1] in MODULES:
                found.add(parts[1])
    return found


def function_level_imports(source: str) -> list[int]:
    """Line numbers of imports inside a function body."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines += [
                inner.lineno
                for inner in ast.walk(node)
                if isinstance(inner, ast.Import | ast.ImportFrom)
            ]
    return lines


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of `graph` as a path that starts and ends at the same module, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for succ in sorted(graph.get(node, ())):
            cycle = visit(succ, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle is not None:
            return cycle
    return None


def pricing_graph() -> Graph:
    return {name: imported_pricing_modules(path.read_text()) for name, path in MODULES.items()}


def test_the_graph_sees_the_modules_it_should() -> None:
    graph = pricing_graph()
    assert {"policy", "catalog", "credentials", "scopes", "serving"} <= set(graph)
    assert "policy" in graph["catalog"]
    assert {"catalog", "scopes", "credentials", "policy"} <= graph["serving"]


def test_pricing_has_no_import_cycle() -> None:
    assert find_cycle(pricing_graph()) is None


def test_the_document_imports_nothing_compiled_from_it() -> None:
    compiled = {"catalog", "credentials", "scopes", "serving", "accounts", "observed", "loader"}
    assert pricing_graph()["policy"] & compiled == set()


def test_no_pricing_module_imports_inside_a_function() -> None:
    hidden = {
        name: lines
        for name, path in MODULES.items()
        if (lines := function_level_imports(path.read_text()))
    }
    assert hidden == {}


def test_checkers_catch_what_they_look_for() -> None:
    hidden = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pricing.catalog import Catalog\n"
        "def f():\n    from pricing.scopes import Scopes\n    import pricing.serving\n"
        "from . import loader\n"
    )
    assert imported_pricing_modules(hidden) == {"catalog", "scopes", "serving", "loader"}
    assert function_level_imports(hidden) == [5, 6]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None
