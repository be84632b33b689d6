"""What a framework adapter says when its extra is not installed: the package it
lacks and the pip command that brings it, rather than a bare ModuleNotFoundError."""

from __future__ import annotations


def missing_extra(module: str, extra: str, exc: ModuleNotFoundError) -> ImportError:
    """The ImportError `module` raises for `exc`, naming the extra to install."""
    return ImportError(
        f"{module} needs {exc.name}, which irrev installs without: pip install 'irrev[{extra}]'",
        name=exc.name,
    )
