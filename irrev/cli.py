"""The `irrev` command: one argparse tree; each package configures its own subcommands.

Only the command being run is imported: `irrev --help` lists the commands from the
table below without importing any of them, so it stays fast however heavy a command's
own imports (uvicorn, the fault matrix, numpy and matplotlib for `sim`). A subcommand
module exposes `configure(parser)`, which adds its arguments and sets `func` on the
parser; a `func` returns the process exit code. Errors a user can fix are raised as
`CliError` and printed as one line on stderr with exit code 2 (1 is kept for "checked
and found wrong", as in `irrev ledger audit` and `irrev policy validate`); so are the
ledger's typed errors (a malformed tenant name, say), an embedded redis-server that
cannot start (IRREV_REDIS_SERVER not executable, IRREV_DATA_DIR not creatable), a Redis
that cannot be reached and a command whose optional dependencies (an extra such as
`irrev[sim]`) are not installed. `irrev serve` says its start refusals the same way,
whichever of its processes meets them (gateway/serve.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TypeVar

from pydantic import ValidationError
from redis.exceptions import RedisError

from ledger import EmbeddedRedisError, LedgerError

# The modules each extra of pyproject.toml installs, by the names they are imported as.
EXTRAS = {
    "sim": ("numpy", "scipy", "matplotlib"),
    "load": ("locust", "psutil"),
    "bench": ("fastmcp", "uncalled_for", "psutil"),
}


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    module: str
    help: str
    extra: str | None = None


COMMANDS = (
    Command("serve", "irrev.commands.serve", "run the gateway (settings: IRREV_* variables)"),
    Command("demo", "irrev.commands.demo", "a correlated fleet through a price spike"),
    Command("demo-mcp", "irrev.commands.demo_mcp", "MCP agents' tool calls against one budget"),
    Command(
        "load", "irrev.commands.load", "locust procurement load against a local gateway", "load"
    ),
    Command(
        "faults",
        "irrev.commands.faults",
        "run the fault matrix (crashes, concurrency, Redis, upstream, hostile input)",
    ),
    Command("ledger", "irrev.commands.ledger", "inspect and check the budget ledger"),
    Command("policy", "irrev.commands.policy", "validate, show and issue tokens for policies"),
    Command("keys", "irrev.commands.keys", "create, rotate, revoke and list managed keys"),
    Command(
        "escalations",
        "irrev.commands.escalations",
        "list, approve and reject escalations, through a gateway's admin API",
    ),
    Command(
        "holds",
        "irrev.commands.holds",
        "show a hold, resolve an ambiguous one, through a gateway's admin API",
    ),
    Command("sim", "irrev.commands.sim", "run a fleet simulation experiment", "sim"),
)
BENCHES = (
    Command("ledger", "irrev.bench.ledger", "reserve+post per second vs a trivial EVALSHA"),
    Command(
        "gateway",
        "irrev.bench.gateway",
        "proxy admissions/s and latency vs a bare endpoint",
        "load",
    ),
    Command("lua", "irrev.bench.lua", "reserve's and post's cost inside Redis, before/after"),
    Command(
        "escrow",
        "irrev.bench.escrow",
        "one tenant in one slot vs split over escrow shards on a 3-primary cluster",
    ),
    Command("cli", "irrev.bench.cli", "start-up time of `irrev --help` and `policy validate`"),
    Command("bodies", "irrev.bench.bodies", "CPU to refuse a hostile body vs plain parsing it"),
    Command(
        "mcp",
        "irrev.bench.mcp",
        "MCP tools/call through irrev vs direct and vs FastMCP's proxy (calls/s, latency)",
        "bench",
    ),
    Command(
        "background",
        "irrev.bench.background",
        "Redis commands/s of idle gateways at 1, 4, 16 processes",
    ),
)


class CliError(Exception):
    """A mistake in how a command was called or configured; the message says what to do.
    A subclass may set `exit_code` 1 for "checked and found wrong"."""

    exit_code = 2


Number = TypeVar("Number", int, float)


def bounded(kind: type[Number], low: Number, high: Number | None = None) -> Callable[[str], Number]:
    """An argparse type: a number of `kind` within [low, high]; anything else is a
    one-line usage error (exit 2) naming the range."""
    span = f">= {low}" if high is None else f"between {low} and {high}"
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {noun} {span} (got {text!r})") from None
        if value != value or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {noun} {span} (got {text!r})")
        return value

    return parse


class Version(argparse.Action):
    """`--version`: the version the installed package's metadata records, read only
    when asked: the lookup walks the installed distributions, which `--help` and every
    command would pay for otherwise (argparse's own version action wants the text up
    front)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        try:
            version = metadata.version("irrev")
        except metadata.PackageNotFoundError:
            raise CliError("irrev is not installed (no package metadata): pip install .") from None
        print(f"irrev {version}")
        parser.exit()


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The whole tree, with only the command that `argv` names configured (imported)."""
    parser = argparse.ArgumentParser(
        prog="irrev", description="Fleet-wide irreversibility budget admission controller."
    )
    parser.add_argument(
        "--version", action=Version, nargs=0, help="print the installed version and exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(subparsers, COMMANDS, argv)
    bench = subparsers.add_parser("bench", help="measure throughput and latency")
    benches = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    words = list(argv)
    after_bench = words[words.index("bench") + 1 :] if chosen(words) == "bench" else []
    add_commands(benches, BENCHES, after_bench)
    return parser


def add_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    commands: Sequence[Command],
    argv: Sequence[str],
) -> None:
    name = chosen(argv)
    for command in commands:
        parser = subparsers.add_parser(command.name, help=command.help)
        if command.name == name:
            configure(command, parser)


def chosen(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def configure(command: Command, parser: argparse.ArgumentParser) -> None:
    if command.extra is not None:
        missing = [m for m in EXTRAS[command.extra] if importlib.util.find_spec(m) is None]
        if missing:
            raise CliError(
                f"`{parser.prog}` needs {', '.join(missing)}, which the gateway installs "
                f"without: pip install 'irrev[{command.extra}]'"
            )
    importlib.import_module(command.module).configure(parser)


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
    arguments = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(arguments).parse_args(arguments)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except CliError as exc:
        print(f"irrev: {exc}", file=sys.stderr)
        return exc.exit_code
    except (LedgerError, EmbeddedRedisError) as exc:
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
    # raise irrev.cli.CliError, which a second copy of the class would not catch.
    from irrev.cli import main as run_main

    sys.exit(run_main())
