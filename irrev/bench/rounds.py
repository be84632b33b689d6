"""Rounds of two modes run in turn in one bench run, compared by their medians: what
`irrev bench ledger --group-ms` (alone, grouped) and `irrev bench escrow` (one slot,
escrow) print as data."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from rich.table import Table


class Round(Protocol):
    @property
    def mode(self) -> str: ...


R = TypeVar("R", bound=Round)


def compared(
    rounds: Sequence[R], baseline: str, other: str, measures: Mapping[str, Callable[[R], float]]
) -> dict[str, dict[str, float]]:
    """Each mode's median of each measure over its rounds, and `other`'s against
    `baseline`'s (`<other>_vs_<baseline>`, spaces as underscores)."""
    found: dict[str, dict[str, float]] = {}
    for mode in (baseline, other):
        mine = [r for r in rounds if r.mode == mode]
        found[mode] = {
            name: statistics.median(map(measure, mine)) for name, measure in measures.items()
        }
    ratio = f"{other}_vs_{baseline}".replace(" ", "_")
    found[ratio] = {name: found[other][name] / found[baseline][name] for name in measures}
    return found


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    """The rounds as a table: the mode first, left-aligned, then its figures."""
    shown = Table(title=title)
    for column in columns:
        shown.add_column(column, justify="left" if column == columns[0] else "right")
    for row in rows:
        shown.add_row(*row)
    return shown
