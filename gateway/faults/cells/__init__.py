"""Every cell of the fault matrix, in the order the matrix prints them."""

from __future__ import annotations

from ..matrix import Cell
from . import crash, upstream

CELLS: list[Cell] = [*crash.CELLS, *upstream.CELLS]

__all__ = ["CELLS"]
