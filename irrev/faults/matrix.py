"""Cells, runs and the matrix. A cell is one fault scenario with the checks it makes;
a run is one execution of it on a fresh tenant; a violation is one broken promise
found by a run. Cells that need the same processes share a bench."""

from __future__ import annotations

import asyncio
import fnmatch
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .bench import BenchSpec, Run, open_bench

RUNS = 20
SLOW_RUNS = 5
RUN_TIMEOUT_S = 120.0

CellBody = Callable[[Run], Awaitable[list[str]]]


@dataclass(frozen=True, kw_only=True)
class Cell:
    name: str
    checked: str
    body: CellBody
    spec: BenchSpec = field(default_factory=BenchSpec)
    slow: bool = False
    # Kills or stops the bench's one redis-server: a cluster's failures (a primary
    # killed, a slot moved) are cells of their own in tests/ledger/test_cluster.py.
    standalone_only: bool = False

    @property
    def group(self) -> str:
        return self.name.partition(".")[0]

    @property
    def default_runs(self) -> int:
        return SLOW_RUNS if self.slow else RUNS


@dataclass
class CellResult:
    cell: Cell
    runs: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)
    notes: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.violations == 0 and self.runs > 0

    def note_summary(self) -> str:
        parts = []
        for name, values in sorted(self.notes.items()):
            if values:
                parts.append(f"{name} max {max(values):g} mean {sum(values) / len(values):g}")
        return "; ".join(parts)


def select(
    cells: Iterable[Cell], patterns: str | None, fast: bool, cluster: bool = False
) -> list[Cell]:
    """Cells whose name matches one of the comma-separated globs (or contains it),
    without the slow ones if `fast` and those a cluster cannot run if `cluster`."""
    chosen = [c for c in cells if not (fast and c.slow) and not (cluster and c.standalone_only)]
    if not patterns:
        return chosen
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    return [c for c in chosen if any(fnmatch.fnmatch(c.name, p) or p in c.name for p in wanted)]


async def run_cells(
    cells: list[Cell],
    runs: int | None = None,
    progress: Callable[[CellResult], None] | None = None,
    cluster: bool = False,
    settings: Mapping[str, str] | None = None,
) -> list[CellResult]:
    """Run every cell `runs` times (default: its own count), one bench per spec, on
    an embedded redis-server or (`cluster`) a local Redis Cluster, every gateway with
    `settings` (IRREV_* settings) besides the bench's own."""
    results = {cell.name: CellResult(cell) for cell in cells}
    specs: list[BenchSpec] = []
    for cell in cells:
        if cell.spec not in specs:
            specs.append(cell.spec)
    for spec in specs:
        async with open_bench(spec, cluster, settings) as bench:
            for cell in (c for c in cells if c.spec == spec):
                result = results[cell.name]
                started = time.monotonic()
                for index in range(runs or cell.default_runs):
                    async with bench.run(f"{cell.name}-{index}") as run:
                        found = await _one_run(cell, run)
                    result.runs += 1
                    result.violations += len(found)
                    result.examples.extend(found[: max(0, 5 - len(result.examples))])
                    for name, value in run.notes.items():
                        result.notes.setdefault(name, []).append(value)
                result.seconds = time.monotonic() - started
                # A crash cell leaves its worker armed (re-arming per run is slow); the
                # next cell on this bench must not inherit the crash point.
                await bench.disarm()
                if progress is not None:
                    progress(result)
    return [results[c.name] for c in cells]


async def _one_run(cell: Cell, run: Run) -> list[str]:
    try:
        return await asyncio.wait_for(cell.body(run), RUN_TIMEOUT_S)
    except Exception as exc:
        where = "".join(traceback.format_exception_only(exc)).strip()
        return [f"run failed: {where}"]
