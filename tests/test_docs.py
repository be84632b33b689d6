"""The documents the code leans on say what the code does: every reason code the
gateway can answer with is listed in docs/policy.md, every "contract N" a comment
cites is a numbered promise in docs/design.md, and every `IRREV_*` name the product
reads is in docs/settings.md with its default. Read from the source with `ast`, so a
new refusal or setting cannot ship undocumented. The README stays a front door (at
most 300 lines) and no link between the documents leads nowhere."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ledger", "pricing", "gateway", "sim")
# The product: what a user runs (the `irrev` shell included), not its tests.
PRODUCT = (*PACKAGES, "irrev")
SOURCE_SUFFIXES = (".py", ".lua", ".js", ".html", ".css")
ENV_NAME = re.compile(r"\bIRREV_[A-Z0-9_]*[A-Z0-9]\b")
SETTINGS_ROW = re.compile(r"^\| `(IRREV_[A-Z0-9_]+)` \| ([^|]*) \|", flags=re.MULTILINE)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
README_MAX_LINES = 300
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
    """The module builds gateway/edge/problems.py's HTTP Problem."""
    if path.parts[-3:] == ("gateway", "edge", "problems.py"):
        return True
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "gateway.edge.problems"
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


def settings_classes() -> Iterator[type[BaseSettings]]:
    """Every pydantic-settings class of the product: found in the source by `ast` (a
    class whose base is named like a settings class), then imported to read its fields."""
    for path, tree in _modules(*PRODUCT):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                str(getattr(base, "id", "") or getattr(base, "attr", "")).endswith("Settings")
                for base in node.bases
            ):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found = getattr(importlib.import_module(module), node.name)
                if isinstance(found, type) and issubclass(found, BaseSettings):
                    yield found


def _env_names(cls: type[BaseSettings]) -> Iterator[tuple[str, FieldInfo]]:
    prefix = cls.model_config.get("env_prefix", "")
    for name, field in cls.model_fields.items():
        alias = field.validation_alias if isinstance(field.validation_alias, str) else None
        yield (prefix + (alias or field.alias or name)).upper(), field


def settings_fields() -> dict[str, FieldInfo]:
    """Environment name -> field, for every field of every settings class."""
    fields = {name: field for cls in settings_classes() for name, field in _env_names(cls)}
    assert "IRREV_REDIS_URL" in fields and "IRREV_PORT" in fields, sorted(fields)
    return fields


def names_in(*packages: str) -> set[str]:
    """Every IRREV_* name written in the packages' source (code, comments, scripts)."""
    names: set[str] = set()
    for package in packages:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in SOURCE_SUFFIXES and path.is_file():
                names.update(ENV_NAME.findall(path.read_text(encoding="utf-8")))
    return names


def documented_settings() -> dict[str, str]:
    """docs/settings.md's table rows: name -> its default cell."""
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    return {name: default.strip() for name, default in SETTINGS_ROW.findall(text)}


def shown(value: Any) -> str:
    """A default as docs/settings.md writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Path):
        home = str(Path.home())
        return "~" + str(value)[len(home) :] if str(value).startswith(home) else str(value)
    return str(value) if value != "" else "empty"


def test_every_irrev_name_in_the_product_is_documented() -> None:
    used = names_in(*PRODUCT) | set(settings_fields())
    assert len(used) > 50, sorted(used)
    missing = used - set(documented_settings())
    assert not missing, f"IRREV_ names missing from docs/settings.md's tables: {sorted(missing)}"


def test_the_settings_tables_list_nothing_nobody_reads() -> None:
    known = names_in(*PRODUCT, "tests", ".ci") | set(settings_fields())
    stale = set(documented_settings()) - known
    assert not stale, f"docs/settings.md documents names nothing reads: {sorted(stale)}"


def test_every_setting_is_documented_with_its_default() -> None:
    documented = documented_settings()
    wrong = {}
    for name, field in settings_fields().items():
        default = shown(field.get_default(call_default_factory=True))
        cell = documented.get(name, "")
        if cell.split(" ", 1)[0].strip("`") != default:
            wrong[name] = (default, cell)
    assert not wrong, f"docs/settings.md's defaults differ from the code's: {wrong}"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    assert lines[0] == "# irrev"
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[0] == "## Set up (two commands)", sections
    setup = lines[lines.index(sections[0]) : lines.index(sections[1])]
    commands = [line.strip() for line in setup if line.startswith("    ")]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install -q . && .venv/bin/irrev demo",
        "python3 -m venv .venv && .venv/bin/pip install -q '.[test]' && .venv/bin/pytest",
    ], commands


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_leads_to_a_file() -> None:
    broken = []
    for path in markdown_files():
        for target in MARKDOWN_LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_linked_section_exists() -> None:
    """A link to `file.md#anchor` names a heading of that file (GitHub's anchors)."""
    broken = []
    for path in markdown_files():
        for target in MARKDOWN_LINK.findall(path.read_text(encoding="utf-8")):
            file, _, anchor = target.partition("#")
            if not anchor or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            linked = (path.parent / file) if file else path
            if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken


def headings(path: Path) -> list[tuple[int, str]]:
    """(level, GitHub's anchor) of every heading outside code blocks, in order."""
    found: list[tuple[int, str]] = []
    seen: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^(#{1,6}) (.*)$", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(2).strip().lower()).replace(" ", "-")
            base, n = slug, 1
            while slug in seen:
                slug, n = f"{base}-{n}", n + 1
            seen.add(slug)
            found.append((len(heading.group(1)), slug))
    return found


def anchors(path: Path) -> set[str]:
    return {slug for _, slug in headings(path)}


LONG_DOC_LINES = 150


def test_every_long_document_has_a_table_of_contents() -> None:
    """A docs page past LONG_DOC_LINES opens with `Contents:`, a list linking every one
    of its sections (`##`), before the first of them."""
    lacking = {}
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) <= LONG_DOC_LINES:
            continue
        first_section = text.find("\n## ")
        contents = text.find("\nContents:\n")
        if contents == -1 or contents > first_section:
            lacking[path.name] = "no Contents: before its first section"
            continue
        listed = set(re.findall(r"\]\(#([^)]+)\)", text[contents:first_section]))
        sections = {slug for level, slug in headings(path) if level == 2}
        if missing := sections - listed:
            lacking[path.name] = f"sections not in its Contents: {sorted(missing)}"
    assert not lacking, lacking


def test_no_package_registry_is_named() -> None:
    """The repository never names a package registry's host (pip's index is the
    machine's own configuration, not the project's)."""
    hosts = re.compile(r"pypi\.org|files\.pythonhosted|registry\.npmjs|crates\.io|proxy\.golang")
    named = []
    # The repository's files: tracked, or new and not ignored (not a build's output:
    # out/ holds a previous release's venv, whose packages name their index).
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if hosts.search(text):
            named.append(str(path.relative_to(ROOT)))
    assert not named, named
