"""Import each module named on stdin first, each in a process of its own, and print
one line per module that fails: `<name>: <last line of its error>`.

Run as a script by tests/test_layers.py. The third-party modules that `names` import
are imported once here, before forking (none of them imports first-party code, so
every first-party module is still the first of its project imported in its child):
a fresh interpreter per module spent most of its time importing the same
third-party libraries, about a minute over the gateway's and ledger's modules."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import traceback

FIRST_PARTY = frozenset({"ledger", "pricing", "gateway", "sim", "irrev"})


def third_party(names: list[str]) -> list[str]:
    """The modules outside FIRST_PARTY that importing `names` loads, read from a
    throwaway interpreter (one that fails to import is left for its child to report)."""
    code = (
        "import contextlib, importlib, sys\n"
        f"for name in {names!r}:\n"
        "    with contextlib.suppress(Exception): importlib.import_module(name)\n"
        "print('\\n'.join(sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    return [name for name in loaded if name.partition(".")[0] not in FIRST_PARTY]


def preload(modules: list[str]) -> None:
    for name in modules:
        # An alias in sys.modules (six.moves and the like) need not import by its name.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    loaded = {name.partition(".")[0] for name in sys.modules}
    if loaded & FIRST_PARTY:
        raise SystemExit(f"a third-party import loaded {sorted(loaded & FIRST_PARTY)}")


def import_alone(name: str) -> int:
    """Fork; the child imports `name` and exits 0, or prints why not and exits 1."""
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            last = traceback.format_exc().strip().splitlines()[-1]
            print(f"{name}: {last}", flush=True)
            os._exit(1)
        os._exit(0)
    return pid


def main() -> int:
    names = sys.stdin.read().split()
    preload(third_party(names))
    running: set[int] = set()
    failed = 0
    for name in names:
        if len(running) >= (os.cpu_count() or 1):
            pid, status = os.wait()
            running.discard(pid)
            failed += os.waitstatus_to_exitcode(status) != 0
        running.add(import_alone(name))
    for pid in running:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
