from __future__ import annotations

import json
from pathlib import Path

import pytest

from irrev.cli import main


def test_sim_writes_table_json_csv_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "e1", "--seeds", "4", "--out", str(tmp_path)]) == 0
    assert "irrev-stressed" in capsys.readouterr().out
    data = json.loads((tmp_path / "e1.json").read_text())
    assert {r["arm"] for r in data["rows"]} >= {"local", "budget", "breaker-10", "irrev"}
    assert (tmp_path / "e1.csv").read_text().startswith("case,")
    assert (tmp_path / "e1.png").stat().st_size > 0


def test_sim_rejects_zero_seeds(tmp_path: Path) -> None:
    assert main(["sim", "e1", "--seeds", "0", "--out", str(tmp_path)]) == 2
