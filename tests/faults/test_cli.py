"""`irrev faults` selection and output, without running cells."""

from __future__ import annotations

import json

import pytest

from irrev.cli import main
from irrev.commands.faults import format_matrix, settings_of
from irrev.faults.cells import CELLS
from irrev.faults.matrix import CellResult, select


def test_at_least_39_cells_with_unique_names() -> None:
    names = [cell.name for cell in CELLS]
    assert len(names) >= 39
    assert len(set(names)) == len(names)


def test_every_group_is_covered() -> None:
    assert {cell.group for cell in CELLS} == {
        "abuse",
        "crash",
        "concurrency",
        "redis",
        "upstream",
        "hostile",
        "credentials",
        "differential",
        "settlement",
        "mcp",
        "escrow",
    }


@pytest.mark.parametrize(
    ("pattern", "fast", "expected"),
    [
        ("crash.*", False, 4),
        ("crash.*", True, 0),
        ("mcp.*", False, 5),
        ("approve_k", False, 4),
        ("concurrency.retry_k16,hostile.nan_infinity", False, 2),
    ],
    ids=["glob", "glob-fast", "mcp", "substring", "list"],
)
def test_select(pattern: str, fast: bool, expected: int) -> None:
    assert len(select(CELLS, pattern, fast)) == expected


def test_list_and_unknown_pattern(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults", "--list", "--cells", "hostile.*"]) == 0
    assert capsys.readouterr().out.count("hostile.") == len(select(CELLS, "hostile.*", False))
    assert main(["faults", "--cells", "no-such-cell"]) == 2


def test_format_matrix_counts_violations() -> None:
    ok, bad = CellResult(CELLS[0], runs=20), CellResult(CELLS[1], runs=5, violations=2)
    text = format_matrix([ok, bad])
    assert f"| {CELLS[0].name} | 20 | 0 |" in text
    assert f"| {CELLS[1].name} | 5 | 2 |" in text
    assert text.endswith("2 cells, 25 runs, 2 violations")


def test_every_crash_point_is_wired() -> None:
    """A refactor of the admission path must not drop a crash point silently."""
    from pathlib import Path

    import gateway
    from gateway.pipeline.crashpoints import POINTS

    source = "".join(p.read_text() for p in Path(gateway.__file__).parent.rglob("*.py"))
    for point in POINTS:
        assert f'crash_point("{point}")' in source, point


def test_list_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["faults", "--list", "--json", "--cells", "crash.*"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["cell"] for c in listed] == [c.name for c in select(CELLS, "crash.*", False)]
    assert all(c["slow"] for c in listed)


def test_settings_are_irrev_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """`--setting NAME=VALUE` runs every gateway with an IRREV_* setting; anything
    else is refused in one line before a bench starts."""
    assert settings_of(["IRREV_GROUP_WAIT_MS=1", "IRREV_LOG_LEVEL=a=b"]) == {
        "IRREV_GROUP_WAIT_MS": "1",
        "IRREV_LOG_LEVEL": "a=b",
    }
    for bad in ("PATH=/tmp", "IRREV_GROUP_WAIT_MS", "irrev_x=1"):
        assert main(["faults", "--cells", "hostile.non_json", "--setting", bad]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and "IRREV_* setting" in error
