"""The fault matrix under pytest: every fast cell, a few runs each, on real
processes (`irrev faults` runs 20 per cell). The cells are run once per session,
grouped by the processes they need, and each cell is then its own test, so a
failure names the cell and the broken promise. With IRREV_TEST_SERVERS=cluster the
benches run on a local Redis Cluster instead, without the cells that kill the one
redis-server; .ci/run's cluster pass keeps only the tests that take a server fixture,
so CI runs the matrix on the embedded Redis only."""

from __future__ import annotations

import os

import pytest

from irrev.faults.cells import CELLS
from irrev.faults.matrix import CellResult, run_cells, select

from ..conftest import SUITE_SERVERS

CLUSTER = SUITE_SERVERS == ["cluster"]
FAST = select(CELLS, None, fast=True, cluster=CLUSTER)
SLOW = [cell for cell in select(CELLS, None, fast=False, cluster=CLUSTER) if cell.slow]
RUNS = int(os.environ.get("IRREV_FAULT_RUNS", "2"))


@pytest.fixture(scope="module")
async def fast_results() -> dict[str, CellResult]:
    return {r.cell.name: r for r in await run_cells(FAST, RUNS, cluster=CLUSTER)}


@pytest.fixture(scope="module")
async def slow_results() -> dict[str, CellResult]:
    return {r.cell.name: r for r in await run_cells(SLOW, 1, cluster=CLUSTER)}


def _verdict(result: CellResult) -> None:
    assert result.runs > 0
    assert result.violations == 0, f"{result.cell.name}: " + "; ".join(result.examples)


# Slow too (about a minute for all of them): README's test command leaves the matrix
# out; .ci/run runs it on each server.
@pytest.mark.slow
@pytest.mark.parametrize("name", [cell.name for cell in FAST])
def test_fast_cell(fast_results: dict[str, CellResult], name: str) -> None:
    _verdict(fast_results[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [cell.name for cell in SLOW])
def test_slow_cell(slow_results: dict[str, CellResult], name: str) -> None:
    _verdict(slow_results[name])
