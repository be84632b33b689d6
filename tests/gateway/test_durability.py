"""IRREV_DURABILITY: `irrev serve` reads the Redis persistence settings at start; on
a server that can lose an acknowledged write (here AOF turned off) `require` refuses
to start, in one line naming the cause, and `warn` (the default) starts and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from ledger import EmbeddedRedis

from .servers import BIN, Server, base_env, write_policy
from .test_serve import refused_start

# Slow (README's test command leaves it out; .ci/run runs it).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["require", "warn"])
def test_a_server_without_aof(mode: str, redis_binary: Path, tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "redis", binary=redis_binary, tcp=True) as server:
        with redis.Redis.from_url(server.url) as client:
            client.config_set("appendonly", "no")
        write_policy(tmp_path / "policies", "procurement", "durable", "http://127.0.0.1:9")
        env = {
            "IRREV_REDIS_URL": server.url,
            "IRREV_POLICY_DIR": str(tmp_path / "policies"),
            "IRREV_DURABILITY": mode,
        }
        if mode == "require":
            # Several workers meet the refusal; it is said once.
            line = refused_start("--workers", "2", **env)
            assert "appendonly is no" in line, line
            return
        gateway = Server(
            name="gateway",
            argv=[str(BIN / "irrev"), "serve"],
            env=base_env(**env),
            log_path=tmp_path / "gw.log",
        )
        gateway.argv += ["--port", str(gateway.port), "--workers", "1"]
        try:
            gateway.start("/readyz")
        finally:
            gateway.stop()
        assert "appendonly is no" in gateway.log(20_000)
