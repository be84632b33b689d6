"""The gateway's layering, read from its source: routers (modules with an APIRouter)
parse and shape, and share code only through non-router modules; the request a
hold keeps is built in one place, the admission pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(GATEWAY.rglob("*.py"))}


def _is_router(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Call) and getattr(node.func, "id", "") == "APIRouter"
        for node in ast.walk(tree)
    )


def _local_imports(tree: ast.Module) -> set[str]:
    """The gateway modules `tree` imports, by their names in their rooms."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gateway"):
            parts = (node.module or "").split(".")
            if len(parts) > 2:
                found.add(parts[2])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_no_router_imports_another_router() -> None:
    modules = _modules()
    routers = {name for name, tree in modules.items() if _is_router(tree)}
    assert {"proxy", "holds_api", "escalations", "admin_policies"} <= routers
    crossing = {name: _local_imports(modules[name]) & routers for name in routers}
    assert {name: found for name, found in crossing.items() if found} == {}


def test_the_kept_request_is_built_only_by_the_pipeline() -> None:
    builders = {
        name
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "StoredRequest"
    }
    assert builders == {"prepare"}
