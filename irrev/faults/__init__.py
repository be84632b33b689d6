"""The fault matrix: cells of crashes, concurrent delivery, Redis restarts, upstream
faults and hostile input, each run on real processes, each checking the contract
of docs/design.md against the store and the upstream. `irrev faults` runs it."""

from __future__ import annotations

from .bench import BenchSpec, Run, open_bench
from .matrix import Cell, CellResult, run_cells, select

__all__ = ["BenchSpec", "Cell", "CellResult", "Run", "open_bench", "run_cells", "select"]
