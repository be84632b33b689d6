"""`irrev bench cli`: how long the CLI takes to start, as a user meets it.

Each command runs as a fresh process (`python -m irrev.cli ...`, what the `irrev`
script runs) `--runs` times; the median and the fastest wall time are printed. `irrev
--help` imports no command; `irrev policy validate examples/*.yaml` imports pricing
and validates the example policies (files only, no Redis). `--baseline` names another
installation's `irrev` script (an older release in its own venv, say): its runs are
interleaved with this one's, so both see the same machine, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from irrev.cli import CliError, bounded

EXAMPLES = Path("examples")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=bounded(int, 1, 100), default=7, help="runs per command")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="IRREV",
        help="another installation's irrev script to time in the same run (before/after)",
    )
    parser.add_argument("--json", action="store_true", help="print the timings as JSON")
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
    this = [sys.executable, "-m", "irrev.cli"]
    baseline = [str(checked(args.baseline))] if args.baseline else None
    # The baseline brings its own packages: a PYTHONPATH pointing at this tree would
    # make it import this code instead.
    alone = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    if not args.json:
        print(f"{'command':<40} {'median s':>9} {'fastest s':>10}   ({args.runs} runs each)")
    timings: list[dict[str, object]] = []
    for label, arguments in commands.items():
        times, before = [], []
        for _ in range(args.runs):
            times.append(timed(this, arguments, dict(os.environ)))
            if baseline:
                before.append(timed(baseline, arguments, alone))
        timing: dict[str, object] = {
            "command": label,
            "runs": args.runs,
            "median_s": statistics.median(times),
            "fastest_s": min(times),
        }
        if baseline:
            timing["baseline_median_s"] = statistics.median(before)
            timing["baseline_fastest_s"] = min(before)
            timing["ratio"] = statistics.median(before) / statistics.median(times)
        timings.append(timing)
        if args.json:
            continue
        print(f"{label:<40} {statistics.median(times):>9.3f} {min(times):>10.3f}")
        if baseline:
            ratio = statistics.median(before) / statistics.median(times)
            print(
                f"{'  baseline':<40} {statistics.median(before):>9.3f} {min(before):>10.3f}"
                f"   (this one {ratio:.1f}x faster by median)"
            )
    if args.json:
        print(json.dumps(timings, indent=2))
    return 0


def checked(script: Path) -> Path:
    if not script.is_file():
        raise CliError(f"--baseline {script}: no such file; give the path of an irrev script")
    return script


def timed(command: list[str], arguments: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one `irrev` process; a command that fails is an error, not a time."""
    started = time.perf_counter()
    result = subprocess.run([*command, *arguments], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise CliError(f"irrev {' '.join(arguments)} exited {result.returncode}: {result.stderr}")
    return elapsed
