"""Not collected by the suite (no `test_` prefix): tests/test_session_servers.py runs
it in a pytest of its own, which it then sends SIGTERM."""

from __future__ import annotations

import os
import time
from pathlib import Path


def test_holds_the_session_server(redis_url: str) -> None:
    Path(os.environ["IRREV_VICTIM_URL_FILE"]).write_text(redis_url)
    time.sleep(120)
