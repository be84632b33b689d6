"""Every cell of the fault matrix, in the order the matrix prints them."""

from __future__ import annotations

from ..matrix import Cell
from . import (
    abuse,
    concurrency,
    crash,
    credentials,
    differential,
    escrow,
    hostile,
    mcp,
    redis,
    settlement,
    upstream,
)

CELLS: list[Cell] = [
    *crash.CELLS,
    *concurrency.CELLS,
    *redis.CELLS,
    *upstream.CELLS,
    *hostile.CELLS,
    *credentials.CELLS,
    *differential.CELLS,
    *settlement.CELLS,
    *mcp.CELLS,
    *abuse.CELLS,
    *escrow.CELLS,
]

__all__ = ["CELLS"]
