"""Sizes of the product code, read from its syntax trees: no function (methods and
nested functions included; a function's length is from its `def` line to its last
line, decorators left out) over MAX_FUNCTION_LINES lines, and no module over
MAX_MODULE_LINES lines. A long function mixes steps that each deserve a name; a long
module mixes things that each deserve a module. There is no allowlist."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "pricing", "gateway", "sim", "irrev")
MAX_FUNCTION_LINES = 70
MAX_MODULE_LINES = 600


def sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def long_functions(source: str, where: str) -> list[str]:
    """`where:line name is N lines` for each function of `source` over the bound, in
    the order of their `def` lines."""
    functions = sorted(
        (node.lineno, node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source, where))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
    )
    return [
        f"{where}:{line} {name} is {length} lines"
        for line, name, length in functions
        if length > MAX_FUNCTION_LINES
    ]


def long_module(source: str, where: str) -> list[str]:
    length = len(source.splitlines())
    return [f"{where} is {length} lines"] if length > MAX_MODULE_LINES else []


def test_the_product_packages_are_all_read() -> None:
    found = {path.relative_to(ROOT).parts[0] for path in sources()}
    assert found == set(PACKAGES)


def test_no_function_is_too_long() -> None:
    offenders = [
        offender
        for path in sources()
        for offender in long_functions(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))
        )
    ]
    assert offenders == [], (
        f"functions over {MAX_FUNCTION_LINES} lines: split each into smaller functions "
        "named for the steps they take:\n" + "\n".join(offenders)
    )


def test_no_module_is_too_long() -> None:
    offenders = [
        offender
        for path in sources()
        for offender in long_module(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert offenders == [], (
        f"modules over {MAX_MODULE_LINES} lines: split each into modules named for what "
        "they hold:\n" + "\n".join(offenders)
    )


def statements(count: int, indent: int) -> str:
    return "".join(f"{' ' * indent}x{i} = {i}\n" for i in range(count))


def test_the_measure_counts_what_it_should() -> None:
    """Methods and nested functions count, decorators do not, a short module passes."""
    most = MAX_FUNCTION_LINES - 1  # a body this long and its `def` line just fit
    source = (
        "@decorated\n"
        f"def fits():\n{statements(most, 4)}"
        "class C:\n"
        f"    async def method(self):\n{statements(most + 1, 8)}"
        "def outer():\n"
        f"    def inner():\n{statements(most + 1, 8)}"
    )
    assert long_functions(source, "m.py") == [
        f"m.py:{MAX_FUNCTION_LINES + 3} method is {MAX_FUNCTION_LINES + 1} lines",
        f"m.py:{2 * MAX_FUNCTION_LINES + 4} outer is {MAX_FUNCTION_LINES + 2} lines",
        f"m.py:{2 * MAX_FUNCTION_LINES + 5} inner is {MAX_FUNCTION_LINES + 1} lines",
    ]
    assert long_module("x = 1\n" * MAX_MODULE_LINES, "m.py") == []
    assert long_module("x = 1\n" * (MAX_MODULE_LINES + 1), "m.py") == [
        f"m.py is {MAX_MODULE_LINES + 1} lines"
    ]
