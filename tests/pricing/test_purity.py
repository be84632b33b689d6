"""pricing/ stays pure: none of its modules imports an I/O, clock or randomness module,
nor scipy (two seconds of import for every gateway worker and CLI call)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pricing

FORBIDDEN = {
    "redis",
    "fastapi",
    "httpx",
    "os",
    "time",
    "random",
    "socket",
    "subprocess",
    "scipy",
    "numpy",
}
PRICING_DIR = Path(pricing.__file__).parent
MODULES = sorted(PRICING_DIR.glob("*.py"))


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_pricing_module_is_checked() -> None:
    assert len(MODULES) >= 8
    assert {p.name for p in MODULES} >= {"policy.py", "catalog.py", "models.py", "learning.py"}


@pytest.mark.parametrize("module", MODULES, ids=[p.name for p in MODULES])
def test_module_imports_no_io(module: Path) -> None:
    assert imported_roots(module.read_text()) & FORBIDDEN == set()


def test_checker_catches_forbidden_imports() -> None:
    source = "import os.path\nfrom time import monotonic\nimport redis.asyncio as r\n"
    source += "from scipy.stats import norm\n"
    assert imported_roots(source) & FORBIDDEN == {"os", "time", "redis", "scipy"}
