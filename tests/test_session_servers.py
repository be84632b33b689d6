"""A pytest sent SIGTERM (CI ending a pass beside one that failed, or its time limit)
stops the session's Redis servers: they are not harness Servers, so before they were
left running, one orphaned redis-server per pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from irrev.harness import answers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def listening(url: str) -> bool:
    parts = urlsplit(url)
    return answers(parts.hostname or "", parts.port or 0)


def test_sigterm_stops_the_sessions_redis(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    argv = ["-q", "-p", "no:cacheprovider", "-m", "", "--basetemp", str(tmp_path / "victim")]
    victim = subprocess.Popen(
        [sys.executable, "-m", "pytest", *argv, "tests/sigterm_victim.py"],
        cwd=ROOT,
        env={**os.environ, "IRREV_VICTIM_URL_FILE": str(url_file)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not url_file.exists() or not url_file.read_text():
            assert victim.poll() is None, "the victim pytest ended before its test ran"
            assert time.monotonic() < deadline, "the victim's test did not start in 120 s"
            time.sleep(0.05)
        url = url_file.read_text()
        assert listening(url)
        victim.send_signal(signal.SIGTERM)
        assert victim.wait(timeout=60) == -signal.SIGTERM
        deadline = time.monotonic() + 10
        while listening(url) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not listening(url), f"the session's Redis at {url} outlived its pytest"
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
