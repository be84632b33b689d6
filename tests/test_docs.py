"""The documents the code leans on say what the code does: every reason code the
gateway can answer with is listed in docs/policy.md, and every "contract N" a comment
cites is a numbered promise in docs/design.md. Read from the source with `ast`, so a
new refusal cannot ship undocumented."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "pricing", "gateway", "sim")
CODE = re.compile(r"^[a-z][a-z0-9_]*$")


def _modules(*packages: str) -> Iterator[tuple[Path, ast.Module]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _reason_parameters(tree: ast.Module) -> dict[str, int]:
    """Functions of a module that take a `reason` argument, and its position."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [a.arg for a in node.args.args]
            if "reason" in names:
                found[node.name] = names.index("reason")
    return found


def _raises_problems(path: Path, tree: ast.Module) -> bool:
    """The module builds gateway/problems.py's HTTP Problem (pricing has its own
    Problem, a fault of a policy file, which is no reason code)."""
    if path.parts[-2:] == ("gateway", "problems.py"):
        return True
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "problems"
        and any(alias.name == "Problem" for alias in node.names)
        for node in ast.walk(tree)
    )


def _constant(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _is_status(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, int) and 400 <= node.value < 600
    )


def gateway_reasons() -> tuple[set[str], list[str]]:
    """Every reason code written in the gateway's and pricing's source, and the places
    a Problem gets a reason the analysis cannot read (which must not exist)."""
    reasons: set[str] = set()
    unreadable: list[str] = []
    for path, tree in _modules("gateway", "pricing"):
        if "faults" in path.parts:
            continue
        takes_reason = _reason_parameters(tree)
        http_problems = _raises_problems(path, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node) == "Problem" and http_problems:
                code = _constant(node.args[1]) if len(node.args) > 1 else None
                if code is not None:
                    reasons.add(code)
                elif not (
                    len(node.args) > 1 and isinstance(node.args[1], ast.Name | ast.Attribute)
                ):
                    unreadable.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.Call) and _name(node) in takes_reason:
                position = takes_reason[_name(node)]
                if len(node.args) > position and (code := _constant(node.args[position])):
                    reasons.add(code)
            elif isinstance(node, ast.Tuple) and len(node.elts) > 1 and _is_status(node.elts[0]):
                if code := _constant(node.elts[1]):
                    reasons.add(code)
            elif (
                isinstance(node, ast.Dict)
                and node.keys
                and all(k is not None and _is_status(k) for k in node.keys)
            ):
                reasons.update(c for v in node.values if (c := _constant(v)))
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.Assign)
                        and any(getattr(t, "id", "") == "reason" for t in statement.targets)
                        and (code := _constant(statement.value))
                    ):
                        reasons.add(code)
    return {r for r in reasons if CODE.match(r)}, unreadable


def documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    table = text.split("<!-- reason-codes -->", 1)[1]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, flags=re.MULTILINE))


def test_every_reason_code_is_documented() -> None:
    reasons, unreadable = gateway_reasons()
    assert not unreadable, f"Problem() reasons that are not literals or names: {unreadable}"
    assert len(reasons) > 40, sorted(reasons)
    missing = reasons - documented_reasons()
    assert not missing, f"reason codes missing from docs/policy.md: {sorted(missing)}"


def test_the_reason_table_lists_nothing_the_code_cannot_say() -> None:
    reasons, _ = gateway_reasons()
    stale = documented_reasons() - reasons
    assert not stale, f"docs/policy.md lists reason codes the code no longer has: {sorted(stale)}"


def test_every_cited_contract_is_in_the_design() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    promises = {int(n) for n in re.findall(r"^(\d+)\. \*\*", design, flags=re.MULTILINE)}
    assert promises == set(range(1, 11))
    cited: dict[int, str] = {}
    for package in (*PACKAGES, "tests"):
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".lua") and path.is_file():
                for number in re.findall(r"contract (\d+)", path.read_text(encoding="utf-8")):
                    cited[int(number)] = str(path.relative_to(ROOT))
    assert cited, "no 'contract N' citations found: is the pattern still right?"
    assert set(cited) <= promises, {n: p for n, p in cited.items() if n not in promises}


def documented_settings() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(IRREV_[A-Z0-9_]+)`", table))


def test_every_setting_is_documented() -> None:
    """`irrev serve --help` sends people to docs/operations.md, "Settings", for every
    setting it does not name: each field of the settings models is there, and no
    other."""
    from gateway.settings import GatewaySettings
    from ledger import LedgerSettings

    fields = {*GatewaySettings.model_fields, *LedgerSettings.model_fields}
    assert documented_settings() == {f"IRREV_{name.upper()}" for name in fields}
