"""The commands that run the stack from the example policies say where to run them,
in one line, when they are started elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .servers import ROOT


@pytest.mark.parametrize("command", [["demo"], ["load", "--seconds", "1"]])
def test_outside_the_repository_is_one_line(command: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *command],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "run this from the root of the irrev repository" in result.stderr.strip()
