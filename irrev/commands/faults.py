"""`irrev faults`: run the fault matrix and print it; exit 1 on any violation."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path

from rich.console import Console

from irrev.cli import CliError
from irrev.faults.cells import CELLS
from irrev.faults.matrix import CellResult, run_cells, select


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", help="comma-separated globs of cell names (default: all)")
    parser.add_argument("--runs", type=int, help="runs per cell (default 20, slow cells 5)")
    parser.add_argument("--fast", action="store_true", help="skip the cells marked slow")
    parser.add_argument("--list", action="store_true", help="list the cells and exit")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print the results as JSON instead of the matrix; with FILE, also write them there",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on a local 3-primary + 3-replica Redis Cluster (needs Redis 7's "
        "redis-server and redis-cli); cells that kill the one redis-server are left out",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="run every gateway with this IRREV_* setting too (repeatable), e.g. "
        "IRREV_GROUP_WAIT_MS=1 to hold the promises with group commit",
    )
    parser.set_defaults(func=run)


def settings_of(pairs: list[str]) -> dict[str, str]:
    """--setting NAME=VALUE pairs, each name an IRREV_* variable."""
    settings: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"IRREV_[A-Z0-9_]+", name):
            raise CliError(f"--setting {pair!r}: must be NAME=VALUE with NAME an IRREV_* setting")
        settings[name] = value
    return settings


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args.setting)
    cells = select(CELLS, args.cells, args.fast, args.cluster)
    if not cells:
        raise CliError(f"no cell matches {args.cells!r}; see `irrev faults --list`")
    if args.runs is not None and not 1 <= args.runs <= 1000:
        raise CliError("--runs must be between 1 and 1000")
    console = Console(stderr=True)
    if args.list:
        if args.json == "-":
            listed = [{"cell": c.name, "slow": c.slow, "checked": c.checked} for c in cells]
            print(json.dumps(listed, indent=2))
            return 0
        for cell in cells:
            print(f"{cell.name:<34} {'slow' if cell.slow else 'fast'}  {cell.checked}")
        return 0

    def progress(result: CellResult) -> None:
        verdict = "ok" if result.ok else f"{result.violations} VIOLATIONS"
        console.print(f"{result.cell.name}: {result.runs} runs, {verdict} ({result.seconds:.0f} s)")

    results = asyncio.run(run_cells(cells, args.runs, progress, args.cluster, settings))
    shown = json.dumps([as_dict(r) for r in results], indent=2)
    if args.json == "-":
        print(shown)
    else:
        print(format_matrix(results))
        if args.json:
            Path(args.json).write_text(shown)
    failed = [r for r in results if not r.ok]
    for result in failed:
        print(f"{result.cell.name}:", file=sys.stderr)
        for example in result.examples:
            print(f"  {example}", file=sys.stderr)
    return 1 if failed else 0


def format_matrix(results: list[CellResult]) -> str:
    """The matrix as a Markdown table: cell, runs, violations, what was checked."""
    lines = ["| cell | runs | violations | checked |", "|---|---:|---:|---|"]
    for result in results:
        checked = result.cell.checked
        if result.notes:
            checked += f" (measured: {result.note_summary()})"
        lines.append(f"| {result.cell.name} | {result.runs} | {result.violations} | {checked} |")
    total = sum(r.violations for r in results)
    lines.append(f"\n{len(results)} cells, {sum(r.runs for r in results)} runs, {total} violations")
    return "\n".join(lines)


def as_dict(result: CellResult) -> dict[str, object]:
    return {
        "cell": result.cell.name,
        "slow": result.cell.slow,
        "runs": result.runs,
        "violations": result.violations,
        "checked": result.cell.checked,
        "examples": result.examples,
        "notes": result.notes,
        "seconds": round(result.seconds, 1),
    }
