"""`irrev bench cli`: how long the CLI takes to start, as a user meets it.

Each command runs as a fresh process (`python -m irrev.cli ...`, what the `irrev`
script runs) `--runs` times; the median and the fastest wall time are printed. `irrev
--help` imports no command; `irrev policy validate examples/*.yaml` imports pricing
and validates the example policies (files only, no Redis).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from irrev.cli import CliError, bounded

EXAMPLES = Path("examples")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=bounded(int, 1, 100), default=7, help="runs per command")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    policies = sorted(str(path) for path in EXAMPLES.glob("*.yaml"))
    if not policies:
        raise CliError(
            f"no {EXAMPLES}/*.yaml in {Path.cwd()}: run this from the root of the irrev "
            "repository, where the example policies are"
        )
    commands = {
        "irrev --help": ["--help"],
        "irrev policy validate examples/*.yaml": ["policy", "validate", *policies],
    }
    print(f"{'command':<40} {'median s':>9} {'fastest s':>10}   ({args.runs} runs each)")
    for label, arguments in commands.items():
        times = [timed(arguments) for _ in range(args.runs)]
        print(f"{label:<40} {statistics.median(times):>9.3f} {min(times):>10.3f}")
    return 0


def timed(arguments: list[str]) -> float:
    """Wall seconds of one `irrev` process; a command that fails is an error, not a time."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", *arguments], capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise CliError(f"irrev {' '.join(arguments)} exited {result.returncode}: {result.stderr}")
    return elapsed
