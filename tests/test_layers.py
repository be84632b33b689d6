"""The layers of the code, read from the import statements (Python's ast, every
import, also those inside functions): the libraries (ledger, pricing on the lowest floor;
gateway and sim above them) never import the shell (irrev) nor a floor above their own,
hold no command-line parsing, and pricing has no import cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"pricing": 0, "ledger": 0, "gateway": 1, "sim": 1, "irrev": 2}
LIBRARIES = ("ledger", "pricing", "gateway", "sim")
PARSERS = ("argparse", "click", "typer")
# Leaf modules any floor may import: they import nothing, so they add no arrow. The
# bounds are the ledger's (its Lua scripts enforce them); pricing refuses earlier with
# the very same numbers.
LEAVES = frozenset({"ledger.limits"})


def modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def imports(name: str, path: Path) -> set[str]:
    """The absolute names of the modules `name` (at `path`) imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            found.add(base)
            # `from package import module` imports the module too.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph(package: str) -> dict[str, set[str]]:
    return {name: imports(name, path) for name, path in modules(package)}


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a module on the same floor of another package, or a higher one."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        if crosses(module, target)
    ]


def crosses(module: str, target: str) -> bool:
    here, there = module.split(".")[0], target.split(".")[0]
    if target in LEAVES or target.rsplit(".", 1)[0] in LEAVES:
        return False
    return here != there and there in FLOORS and FLOORS[there] >= FLOORS[here]


def test_no_package_reaches_up_a_floor() -> None:
    assert upward({m: t for package in FLOORS for m, t in graph(package).items()}) == []


def test_leaves_import_nothing() -> None:
    for leaf in LEAVES:
        path = ROOT / (leaf.replace(".", "/") + ".py")
        assert all(name.startswith("__future__") for name in imports(leaf, path)), leaf


def test_an_upward_import_is_seen(tmp_path: Path) -> None:
    """The reader itself: relative, aliased and function-local imports all count."""
    path = tmp_path / "mod.py"
    path.write_text(
        "import argparse as ap\n"
        "from ...irrev import cli\n"
        "from .. import wire\n"
        "def f():\n"
        "    from gateway.app import app\n"
    )
    found = imports("ledger.sub.mod", path)
    assert {"argparse", "irrev", "irrev.cli", "ledger.wire", "gateway.app"} <= found
    assert upward({"ledger.sub.mod": found}) == [
        "ledger.sub.mod imports gateway.app",
        "ledger.sub.mod imports gateway.app.app",
        "ledger.sub.mod imports irrev",
        "ledger.sub.mod imports irrev.cli",
    ]
    assert upward({"irrev.cli": {"ledger.errors", "gateway.app"}}) == []
    assert parsers({"ledger.sub.mod": found}) == ["ledger.sub.mod imports argparse"]
    assert parsers({"irrev.cli": {"argparse"}}) == []


def parsers(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a command-line parser by a library module."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        if module.split(".")[0] in LIBRARIES and target.split(".")[0] in PARSERS
    ]


def test_no_command_line_parsing_in_a_library() -> None:
    assert parsers({m: t for package in LIBRARIES for m, t in graph(package).items()}) == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in edges:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_cycles_are_found() -> None:
    """The cycle finder itself, on a graph with one cycle and one chain."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_pricing_has_no_import_cycle() -> None:
    edges = {module: targets - {module} for module, targets in graph("pricing").items()}
    # `pricing/__init__` re-exports its modules; an arrow into the package itself is an
    # arrow into all of them, which is how the package is used from outside, not a cycle.
    edges.pop("pricing", None)
    assert cycles(edges) == []


def test_every_ledger_and_gateway_module_imports_on_its_own() -> None:
    """An import cycle among module-level imports fails only when one of its modules
    is imported first (one through gateway.edge.problems broke only the fault matrix,
    which imports gateway.edge.wire first): each module is imported first, in a
    process of its own (tests/import_alone.py)."""
    names = [name for package in ("ledger", "gateway") for name, _ in modules(package)]
    argv = [sys.executable, "-m", "tests.import_alone"]
    result = subprocess.run(
        argv, cwd=ROOT, input="\n".join(names), capture_output=True, text=True, timeout=300
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
