"""The commands that run the stack from the example policies say where to run them,
in one line, when they are started elsewhere."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from irrev.cli import BENCHES, COMMANDS, build_parser, main

from .servers import ROOT, base_env


@pytest.mark.parametrize("command", [["demo"], ["load", "--seconds", "1"]])
def test_outside_the_repository_is_one_line(command: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", *command],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "run this from the root of the irrev repository" in result.stderr.strip()


@pytest.mark.parametrize(
    ("command", "env", "says"),
    [
        (["bench", "ledger", "--seconds", "-1"], {}, "--seconds: must be a number between"),
        (["bench", "ledger", "--holds", "0"], {}, "--holds: must be a whole number between"),
        # 100 holds once measured a negative bytes-per-hold (allocator noise).
        (["bench", "ledger", "--holds", "100"], {}, "--holds 100: too few for a bytes-per-hold"),
        (["bench", "ledger", "--memory-runs", "-1"], {}, "--memory-runs: must be a whole number"),
        (
            ["bench", "ledger", "--url", "redis://127.0.0.1:1", "--appendfsync", "always"],
            {},
            "--appendfsync sets the embedded Redis's",
        ),
        (["bench", "gateway", "--seconds", "0"], {}, "--seconds: must be a number between"),
        (["bench", "cli", "--baseline", "no/irrev"], {}, "--baseline no/irrev: no such file"),
        (["demo", "--seed", "-1"], {}, "--seed: must be a whole number >= 0"),
        (["demo", "--port", "0"], {}, "--port: must be a whole number between 1 and 65535"),
        (["demo-mcp", "--port", "65536"], {}, "--port: must be a whole number between 1"),
        (["load", "--users", "0"], {}, "--users: must be a whole number between 1 and"),
        (["ledger", "journal", "--tenant", "t", "--count", "0"], {}, "--count: must be"),
        (["serve", "--port", "99999"], {}, "IRREV_PORT: Input should be less than or equal"),
        (["serve"], {"IRREV_WORKERS": "many"}, "IRREV_WORKERS: Input should be a valid integer"),
        (["serve"], {"IRREV_APPENDFSYNC": "sometimes"}, "IRREV_APPENDFSYNC: Input should be"),
        (
            ["serve"],
            {"IRREV_ADMIN_TOKENS": "ops team=0123456789abcdef"},
            "IRREV_ADMIN_TOKENS: Value error, an operator's name is 1-100 characters",
        ),
        # The payments example's API key is read from the environment when it loads.
        (
            ["serve", "--policy-dir", "examples"],
            {},
            "credentials.Authorization: environment variable 'PAYMENTS_API_KEY' is not set",
        ),
        (["policy", "token", "--tenant", "a b", "--agent", "x"], {}, "not a name a policy"),
    ],
)
def test_bad_arguments_and_settings_are_one_line(
    command: list[str], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", *command],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert says in result.stderr.strip().splitlines()[-1]


HEAVY = ("scipy", "numpy", "matplotlib", "locust", "uvicorn", "fastapi", "sim", "rich")
# Prints the heavy top-level modules the snippet before it imported.
LIST_HEAVY = f"""
import sys
print(" ".join(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def imported_after(snippet: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", snippet + LIST_HEAVY],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_help_imports_no_command() -> None:
    snippet = (
        "import contextlib, io\nfrom irrev.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
    )
    assert imported_after(snippet) == set()


def test_gateway_app_imports_no_simulator_stack() -> None:
    # The app needs fastapi and uvicorn's friends; never scipy, numpy or matplotlib.
    heavy = imported_after("import gateway.app\n")
    assert heavy & {"scipy", "numpy", "matplotlib", "locust", "sim"} == set()


@pytest.mark.parametrize(
    ("command", "name", "missing", "extra"),
    [
        (["sim", "e1"], "irrev sim", "numpy", "sim"),
        (["load"], "irrev load", "locust", "load"),
        (["bench", "gateway"], "irrev bench gateway", "locust", "load"),
    ],
)
def test_a_missing_extra_is_one_line(
    command: list[str], name: str, missing: str, extra: str
) -> None:
    # The extra's module is made unfindable, as on a gateway-only install.
    snippet = (
        "import importlib.util, sys\nfind = importlib.util.find_spec\n"
        f"importlib.util.find_spec = lambda name, *a: None if name == {missing!r} else find(name, *a)\n"
        f"from irrev.cli import main\nsys.exit(main({command!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"irrev: `{name}` needs {missing}, which the gateway installs "
        f"without: pip install 'irrev[{extra}]'"
    )


def commands_of(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command under `parser`, by its words."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path, parser
        return
    for name, child in groups[0].choices.items():
        yield from commands_of(child, (*path, name))


# `serve` prints nothing but its log, JSON lines already; `policy schema` prints a
# JSON Schema and nothing else.
WITHOUT_JSON = {("serve",), ("policy", "schema")}


def test_every_command_takes_json() -> None:
    """Issue 14: `--json` on every CLI command. Each command is configured (its
    module imported) as when it is run, so that its own arguments are there."""
    seen = set()
    lacking = []
    for words in [(c.name,) for c in COMMANDS] + [("bench", b.name) for b in BENCHES]:
        for path, parser in commands_of(build_parser(words)):
            if path[: len(words)] != words:
                continue
            seen.add(path)
            if path not in WITHOUT_JSON and not any(
                "--json" in a.option_strings for a in parser._actions
            ):
                lacking.append(" ".join(path))
    assert ("ledger", "balance") in seen and ("bench", "background") in seen
    assert not lacking, f"commands without --json: {lacking}"


def parsers_of(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """`parser` and every parser under it, commands with subcommands included."""
    yield path, parser
    for group in parser._actions:
        if isinstance(group, argparse._SubParsersAction):
            for name, child in group.choices.items():
                yield from parsers_of(child, (*path, name))


def unexplained(parser: argparse.ArgumentParser) -> Iterator[str]:
    """The arguments and subcommands of `parser` that `--help` shows without a word."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from (choice.dest for choice in action._choices_actions if not choice.help)
        elif not action.help:
            yield "/".join(action.option_strings) or action.dest


def test_every_argument_has_help() -> None:
    """Every flag, positional argument and subcommand of every command says what it
    is for in `--help`. Each command is configured (imported) as when it is run."""
    lacking = []
    for words in [(), *((c.name,) for c in COMMANDS), *(("bench", b.name) for b in BENCHES)]:
        for path, parser in parsers_of(build_parser(words)):
            if path[: len(words)] == words[: len(path)]:
                lacking += [f"irrev {' '.join(path)}: {name}" for name in unexplained(parser)]
    assert not lacking, f"without help: {sorted(set(lacking))}"


def test_version_is_the_packages() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", "--version"],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"irrev {metadata.version('irrev')}\n"


def test_serve_help_names_what_a_first_run_needs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for setting in ("IRREV_ADMIN_TOKENS", "IRREV_REDIS_URL", "IRREV_DATA_DIR"):
        assert setting in shown
    assert "docs/settings.md" in " ".join(shown.split())


def bench_json(bench: str, *args: str) -> dict[str, Any]:
    """`irrev bench <bench> ARGS --json` in a process of its own; its report, parsed."""
    result = subprocess.run(
        [sys.executable, "-m", "irrev.cli", "bench", bench, *args, "--json"],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


# Slow (README's test command leaves it out; .ci/run runs it): a bench run as a
# command starts its own Redis and gateway and measures for a second (15 s here).
@pytest.mark.slow
def test_bench_background_prints_json() -> None:
    """The shortest run: one idle gateway, one tenant, measured for a second."""
    report = bench_json("background", "--gateways", "1", "--tenants", "1", "--seconds", "1")
    assert (report["tenants"], report["seconds"]) == (1, 1.0)
    [size] = report["sizes"]
    assert size["gateways"] == 1 and size["vs_first"] == 1.0
    assert size["commands_per_s"] == sum(size["by_command"].values()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_bench_gateway_reports_server_cpu_per_request_beside_the_peers(client: str) -> None:
    """A short run: one worker each, two users, 3 s per measurement (locust takes about
    a second to start), the peer on either HTTP client. No timing is asserted, only
    that each run carries its server's CPU per request."""
    short = ["--seconds", "3", "--clients", "2", "--rate", "20", "--workers", "1", "--rounds", "1"]
    report = bench_json("gateway", *short, "--peer-client", client)
    assert report["peer_client"] == client
    runs = report["runs"]
    assert [r["label"].split(":")[0] for r in runs] == ["irrev", "peer", "irrev", "peer"]
    assert all(r["cpu_ms"] > 0 and r["errors"] == 0 for r in runs), runs
    assert report["cpu_ratio"] == runs[0]["cpu_ms"] / runs[1]["cpu_ms"]
    assert report["cpu_ratio_at_rate"] == runs[2]["cpu_ms"] / runs[3]["cpu_ms"]


def test_bench_ledger_skips_its_memory_measurement_with_memory_runs_0() -> None:
    """--memory-runs 0 measures no memory (it had a minimum of 1), so a small --holds,
    refused for a memory figure, is then fine: the shortest run, as JSON."""
    short = ["--seconds", "0.1", "--script-calls", "10", "--holds", "100", "--memory-runs", "0"]
    report = bench_json("ledger", *short)
    # 1 client, concurrent, pipelined, and the trivial script on the ledger's own path
    assert report["memory"] == [] and len(report["modes"]) == 4
    # Each rate carries the client's CPU per call: a pair costs its process more than
    # nothing, and so does a trivial call.
    assert all(
        m[side]["client_cpu_us"] > 0 for m in report["modes"] for side in ("ours", "baseline")
    )
    timed = {t["operation"]: t["calls"] for t in report["script_times"]}
    assert timed["reserve's floor, packed"] == timed["post's floor, packed"] == 10
    # issue 27's measures: the pair's Redis CPU against its floors', and what a core serves
    cpu = {t["operation"]: t["cpu_usec_per_call"] for t in report["script_times"]}
    floors = cpu["reserve's floor"] + cpu["post's floor"]
    assert report["pair"]["pair_vs_floor"] == (cpu["reserve"] + cpu["post"]) / floors
    assert report["pair"]["floor_pairs_per_core"] == 1e6 / floors
