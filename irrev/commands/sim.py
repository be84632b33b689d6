"""`irrev sim EXPERIMENT`: run a named experiment, print its table, write JSON/CSV/PNG."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from irrev.cli import CliError
from sim import experiments, report


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", choices=sorted(experiments.EXPERIMENTS))
    p.add_argument("--seeds", type=int, default=300, help="seeds per case (default 300)")
    p.add_argument("--out", type=Path, default=Path("sim-results"), help="output directory")
    p.add_argument("--agents", type=int, nargs="+", help="fleet size(s); default 50")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise CliError("--seeds must be at least 1")
    if args.agents is not None and min(args.agents) < 1:
        raise CliError("--agents must be positive")
    default = experiments.DEFAULT_AGENTS.get(args.experiment, (50,))
    agents = tuple(args.agents) if args.agents else default
    exp = experiments.EXPERIMENTS[args.experiment](agents)
    console = Console()
    if not console.is_terminal:  # pipes and logs get the whole table, not an 80-column crush
        console = Console(width=200)
    rows, started = [], time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(exp.title, total=sum(len(c.arms) for c in exp.cases))
        for case in exp.cases:
            rows += experiments.run_case(case, args.seeds, lambda: progress.advance(task))
    elapsed = time.perf_counter() - started
    console.print(report.table(exp, rows))
    meta = {"experiment": exp.name, "seeds": args.seeds, "agents": agents, "seconds": elapsed}
    for path in report.write(exp, rows, args.out, meta):
        console.print(f"wrote {path}")
    console.print(f"{elapsed:.1f} s")
    return 0
