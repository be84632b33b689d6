"""`irrev sim EXPERIMENT`: run a named experiment, print its table, write JSON/CSV/PNG/SVG/PDF."""

from __future__ import annotations

import argparse
import subprocess
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from rich.progress import Progress

import pricing
from irrev import output
from irrev.cli import CliError
from sim import experiments, report, world


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "experiment",
        choices=sorted([*experiments.EXPERIMENTS, "run"]),
        help="a published experiment (docs/simulator.md), or run: your own policy and workload",
    )
    p.add_argument("--seeds", type=int, help="seeds per case (default 300, run: the workload's)")
    own = p.add_argument_group("run: your own fleet")
    own.add_argument("--policy", type=Path, help="a tenant policy YAML, as the gateway serves")
    own.add_argument("--workload", type=Path, help="a workload YAML/JSON (examples/workloads/)")
    p.add_argument("--seed0", type=int, help="first seed of every case (default: the case's)")
    p.add_argument("--arms", nargs="+", help="run only these arms of every case (default: all)")
    p.add_argument("--out", type=Path, default=Path("sim-results"), help="output directory")
    p.add_argument("--agents", type=int, nargs="+", help="fleet size(s); default 50")
    world = p.add_argument_group("the world, for every case (default: the experiment's)")
    world.add_argument("--misprice", type=float, help="realised loss = k x priced")
    world.add_argument(
        "--misprice-shape",
        choices=("scale", "shape"),
        help="scale: each residual x k; shape: recovery from another Beta of that mean",
    )
    world.add_argument("--windows", type=int, help="consecutive budget windows")
    world.add_argument("--burst-mult", type=float, help="burst proposal rate x (0.05 published)")
    world.add_argument("--burst-len", type=int, help="burst length in ticks (50 published)")
    world.add_argument("--correlated", action="store_true", help="burst-time recovery Beta(2, 6)")
    arms = p.add_argument_group("the arms' knobs, for every arm that has them")
    arms.add_argument("--settle-delay", type=int, help="ticks to settle a hold (irrev: 20)")
    arms.add_argument("--approval-latency", type=int, help="ticks before a human looks (0)")
    arms.add_argument("--escalation-ttl", type=int, help="ticks an escalation waits (= latency)")
    arms.add_argument("--approvals", type=int, help="human approvals per window")
    arms.add_argument("--calibrate", action="store_true", help="irrev: self-calibrating prices")
    arms.add_argument(
        "--top-limit", type=float, help="irrev: the top account's limit as a fraction of R (1)"
    )
    arms.add_argument(
        "--detector",
        choices=("rate", "cusum"),
        help="irrev-stressed's burst detector: a CUSUM at a calm rate it estimates, the "
        "gateway's (cusum, the default), or a 5-tick count at the true calm rate (rate)",
    )
    arms.add_argument(
        "--calm-history", type=int, help="cusum: ticks of calm requests it warms up on (1000)"
    )
    grid = p.add_argument_group("the pareto grid's axes (--misprices: calibration's too)")
    grid.add_argument(
        "--delays",
        type=int,
        nargs="+",
        default=experiments.PARETO_DELAYS,
        help="settle delays in ticks (default %(default)s)",
    )
    grid.add_argument(
        "--misprices",
        type=float,
        nargs="+",
        default=experiments.PARETO_MISPRICES,
        help="misprice factors k (default %(default)s)",
    )
    grid.add_argument(
        "--latencies",
        type=int,
        nargs="+",
        default=experiments.PARETO_LATENCIES,
        help="approval latencies in ticks (default %(default)s)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the results' JSON (also written to --out)"
    )
    p.set_defaults(func=run)


def _world(args: argparse.Namespace) -> experiments.World:
    p_burst = None if args.burst_mult is None else 0.05 * args.burst_mult
    return experiments.World(
        misprice=args.misprice,
        misprice_shape=args.misprice_shape,
        windows=args.windows,
        p_burst=p_burst,
        burst_len=args.burst_len,
        correlated=True if args.correlated else None,
        settle_delay=args.settle_delay,
        approval_latency=args.approval_latency,
        escalation_ttl=args.escalation_ttl,
        approvals=args.approvals,
        calibrate=True if args.calibrate else None,
        top_limit_frac=args.top_limit,
        detector=args.detector,
        calm_history=args.calm_history,
    )


def _git(*argv: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *argv],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit() -> str | None:
    """The commit the code ran from, '-dirty' when the tree had changes; None outside git."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return None
    return f"{head}-dirty" if _git("status", "--porcelain", "--untracked-files=no") else head


def _check(args: argparse.Namespace) -> None:
    if args.seeds < 1:
        raise CliError("--seeds must be at least 1")
    if args.agents is not None and min(args.agents) < 1:
        raise CliError("--agents must be positive")
    for flag in (
        "settle_delay",
        "approval_latency",
        "escalation_ttl",
        "approvals",
        "burst_len",
        "calm_history",
    ):
        value = getattr(args, flag)
        if value is not None and value < 0:
            raise CliError(f"--{flag.replace('_', '-')} must be >= 0 ticks, not {value}")
    if args.top_limit is not None and not 0 < args.top_limit <= 1:
        raise CliError(f"--top-limit is a fraction of R in (0, 1], not {args.top_limit}")
    if args.windows is not None and args.windows < 1:
        raise CliError("--windows must be at least 1")
    if min(args.delays) < 0 or min(args.latencies) < 0 or min(args.misprices) <= 0:
        raise CliError("--delays and --latencies must be >= 0 and --misprices > 0")


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read the {what} {path}: {e}") from e


def _own_world(args: argparse.Namespace) -> experiments.Experiment:
    """`irrev sim run`: the experiment a policy file and a workload file describe."""
    if args.policy is None or args.workload is None:
        raise CliError("irrev sim run needs --policy FILE and --workload FILE")
    try:
        policy = pricing.load_policy_text(_read(args.policy, "policy"), str(args.policy))
    except pricing.PolicyError as e:
        raise CliError(str(e).replace("\n", "; ")) from e
    try:  # the policy's YAML reader: JSON is YAML, and a duplicate key is refused
        data = pricing.parse_yaml(_read(args.workload, "workload"), str(args.workload))
    except pricing.PolicyError as e:
        raise CliError(str(e).replace("\n", "; ")) from e
    try:
        spec = world.parse_workload(data, str(args.workload))
        if args.seeds is None:
            args.seeds = spec.seeds
        return world.world(policy, spec, str(args.workload))
    except world.WorkloadError as e:
        raise CliError(str(e)) from e


def _only_arms(exp: experiments.Experiment, arms: list[str]) -> experiments.Experiment:
    """The experiment with only the named arms, so a long run spends nothing on the
    others; an arm no case has is a mistake, not an empty table."""
    known = {label for c in exp.cases for label, _ in c.arms}
    unknown = sorted(set(arms) - known)
    if unknown:
        have = ", ".join(sorted(known))
        raise CliError(f"--arms {', '.join(unknown)}: not an arm of {exp.name}; it has {have}")
    cases = tuple(replace(c, arms=tuple(a for a in c.arms if a[0] in arms)) for c in exp.cases)
    return replace(exp, cases=tuple(c for c in cases if c.arms))


def run(args: argparse.Namespace) -> int:
    if args.experiment == "run":
        exp = _own_world(args)
    elif args.policy is not None or args.workload is not None:
        raise CliError("--policy and --workload belong to irrev sim run")
    if args.seeds is None:
        args.seeds = 300
    _check(args)
    default = experiments.DEFAULT_AGENTS.get(args.experiment, (50,))
    agents = tuple(args.agents) if args.agents else default
    if args.experiment == "run":
        if args.agents:
            raise CliError("irrev sim run takes its fleet size from the workload, not --agents")
        if args.calibrate:
            raise CliError(
                "irrev sim run calibrates where the policy's route does (its pricing's "
                "`calibrate:`), not by --calibrate"
            )
    elif args.experiment == "pareto":
        exp = experiments.pareto(
            agents, tuple(args.delays), tuple(args.misprices), tuple(args.latencies)
        )
    elif args.experiment == "calibration":
        exp = experiments.calibration(agents, tuple(args.misprices))
    else:
        exp = experiments.EXPERIMENTS[args.experiment](agents)
    try:
        exp = _world(args).apply(exp)
    except ValueError as e:  # a world the model cannot have, e.g. a burst longer than T
        raise CliError(str(e)) from e
    if args.seed0 is not None:
        exp = replace(exp, cases=tuple(replace(c, seed0=args.seed0) for c in exp.cases))
    if args.arms:
        exp = _only_arms(exp, args.arms)
    console = output.console(stderr=args.json)
    commit = _commit()  # before the run: the tree may move while it runs
    rows, started, cpu = [], time.perf_counter(), time.process_time()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(exp.title, total=sum(len(c.arms) for c in exp.cases))
        for case in exp.cases:
            rows += experiments.run_case(case, args.seeds, lambda: progress.advance(task))
    elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    console.print(report.table(exp, rows))
    verdicts = report.pareto_verdicts(rows)
    if verdicts:
        console.print(report.verdict_table(verdicts))
    meta = {
        "experiment": exp.name,
        "version": metadata.version("irrev"),
        "commit": commit,
        "seeds": args.seeds,
        "seed_blocks": sorted({c.seed0 for c in exp.cases}),
        "agents": agents,
        "seconds": elapsed,
        "cpu_seconds": cpu_s,
    }
    if args.experiment == "run":
        meta |= {
            "policy": str(args.policy),
            "workload": str(args.workload),
            "not_simulated": world.NOT_SIMULATED,
        }
    written = report.write(exp, rows, args.out, meta)
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"{elapsed:.1f} s wall, {cpu_s:.1f} s CPU")
    if args.json:
        print(written[0].read_text())  # the JSON document, first of what was written
    return 0
