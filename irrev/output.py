"""Where the commands print their tables."""

from __future__ import annotations

import sys

from rich.console import Console


def console(*, stderr: bool = False) -> Console:
    """Rich's console; piped or redirected, as wide as a table needs, so that no name
    is cut (rich takes 80 columns when it is not writing to a terminal)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=10_000)
