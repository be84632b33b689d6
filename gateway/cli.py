"""The `irrev` command: one argparse tree; each package registers its own subcommands.

Subcommand modules expose `register(subparsers)` and set `func` on their parsers; a
`func` returns the process exit code. Errors a user can fix are raised as `CliError`
and printed as one line on stderr with exit code 2 (1 is kept for "checked and found
wrong", as in `irrev ledger audit` and `irrev policy validate`); so are the ledger's
typed errors (a malformed tenant name, say) and a Redis that cannot be reached.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError
from redis.exceptions import RedisError

from ledger.errors import LedgerError

COMMAND_MODULES = (
    "gateway.serve",
    "gateway.demo",
    "gateway.load",
    "gateway.faults.cli",
    "ledger.cli",
    "gateway.policy_cli",
    "sim.cli",
)
BENCH_MODULES = ("ledger.bench", "gateway.bench")


class CliError(Exception):
    """A mistake in how a command was called or configured; the message says what to do."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="irrev", description="Fleet-wide irreversibility budget admission controller."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    bench = subparsers.add_parser("bench", help="measure throughput and latency")
    benches = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register_bench(benches)
    return parser


def settings_problem(exc: ValidationError) -> str:
    """A settings model's validation errors as one line naming the IRREV_* variables
    (flags such as `serve --port` land in the same fields)."""
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        name = f"IRREV_{field.upper()}" if exc.title.endswith("Settings") else field
        problems.append(f"{name}: {error['msg']} (got {error.get('input')!r})")
    return "; ".join(problems)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (CliError, LedgerError) as exc:
        print(f"irrev: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"irrev: {settings_problem(exc)}", file=sys.stderr)
        return 2
    except RedisError as exc:
        print(
            f"irrev: Redis: {exc} (IRREV_REDIS_URL names the server; unset, irrev starts "
            "an embedded one)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Run through the imported module, not this `__main__` copy of it: subcommands
    # raise gateway.cli.CliError, which a second copy of the class would not catch.
    from gateway.cli import main as run_main

    sys.exit(run_main())
