"""The gateway's worker processes under uvicorn's supervisor, sharing one Redis (the
configured one, or an embedded one this process starts and keeps running). This process
stays their parent: SIGTERM or SIGINT stops the workers and then releases the embedded
redis-server; a worker that dies is replaced, one that cannot start stops them all and
`run` says so (`irrev serve`, irrev/commands/serve.py, exits non-zero)."""

from __future__ import annotations

import os
import socket
import tempfile
import time

from uvicorn import Config
from uvicorn.supervisors import Multiprocess

from ledger import LedgerSettings, supervised_redis_url

from .credentials import resolve_credentials
from .policies import load_policy_dir
from .settings import GatewaySettings

STARTUP_FAILURE = 3  # a uvicorn worker's exit code when its app did not start
SHUTDOWN_MARGIN_S = 5.0


def check_policies(settings: GatewaySettings) -> None:
    """Load the policies and resolve their tools' credentials once, as every worker will:
    a missing one is then said once, not as each worker's failed startup. Raises
    PolicyLoadError or PolicyError."""
    for policy in load_policy_dir(settings.policy_dir, settings.forward_budget()).values():
        resolve_credentials(policy)


def run(settings: GatewaySettings, ledger: LedgerSettings) -> bool:
    """Serve until a signal stops the workers; False if one failed at start-up. `ledger`
    is `settings.ledger`, built by the caller before it reads any policy."""
    with supervised_redis_url(ledger) as url, tempfile.TemporaryDirectory() as metrics:
        os.environ.update(
            {
                "IRREV_REDIS_URL": url,
                "IRREV_POLICY_DIR": str(settings.policy_dir.absolute()),
            }
        )
        if not settings.instance:
            instance = f"{socket.gethostname()}:{settings.host}:{settings.port}"
            os.environ["IRREV_INSTANCE"] = instance
        if settings.workers > 1:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        return serve_workers(settings)


def serve_workers(settings: GatewaySettings) -> bool:
    """Run the workers until a signal stops them; False if one failed at start-up.
    uvicorn.run would return normally for that with several workers (and re-raise a
    SIGTERM with one, skipping our clean-up), hence its supervisor used directly."""
    config = Config(
        "gateway.app:app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level="warning",
        access_log=False,
    )
    supervisor = _Workers(config, sockets=[config.bind_socket()])
    # In-flight forwards may finish (and settle their holds) within the upstream timeout.
    supervisor.grace_s = settings.upstream_timeout_s + SHUTDOWN_MARGIN_S
    supervisor.run()
    return all(p.exitcode != STARTUP_FAILURE for p in supervisor.processes)


class _Workers(Multiprocess):
    """uvicorn's supervisor, except that a worker still shutting down `grace_s` after
    SIGTERM is killed: uvicorn would wait for it forever (a worker was seen stuck in
    its shutdown after its Redis restarted), and with it the release of the embedded
    redis-server. A killed worker is a crash the ledger is built for: its holds in
    flight turn ambiguous at their deadline and the reconciler settles them."""

    grace_s = SHUTDOWN_MARGIN_S

    def join_all(self) -> None:
        deadline = time.monotonic() + self.grace_s
        for worker in self.processes:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                worker.kill()
                worker.join()
