"""The gateway's worker processes under uvicorn's supervisor, sharing one Redis (the
configured one, or an embedded one this process starts and keeps running). This process
stays their parent: SIGTERM or SIGINT stops the workers and then releases the embedded
redis-server; a worker that dies is replaced, one that cannot start stops them all and
`run` raises StartFailed (`irrev serve`, irrev/commands/serve.py, exits 2).

A start refusal (an error whose message says what was wrong and what to do: Redis
unreachable, a server that cannot keep the durability asked for, a policy that cannot
be used, an address in use) is said once, as that one line: a worker that meets one
(gateway/worker.py) writes it to a file this process reads and exits REFUSED, instead
of logging it inside uvicorn's lifespan traceback (once per worker). Anything else is
a bug, whose traceback uvicorn prints."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

from uvicorn import Config
from uvicorn.supervisors import Multiprocess

from gateway.settings import GatewaySettings
from gateway.state.credentials import resolve_credentials
from gateway.state.policies import load_policy_dir
from ledger import LedgerSettings, supervised_redis_url

STARTUP_FAILURE = 3  # a uvicorn worker's exit code when its app did not start
REFUSED = 4  # a worker's exit code when it refused to start (its reason in REFUSAL_FILE)
# Where `run` tells its workers to write a start refusal (set in their environment).
REFUSAL_FILE = "IRREV_REFUSAL_FILE"
SHUTDOWN_MARGIN_S = 5.0


class StartFailed(Exception):
    """The gateway did not start: its address cannot be listened on, a worker refused
    (its one line), or the workers failed otherwise (a pointer to their tracebacks)."""


def one_line(message: str) -> str:
    """A message of several lines (a PolicyLoadError's, one per fault) as one line."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def check_policies(settings: GatewaySettings) -> None:
    """Load the policies and resolve their tools' credentials once, as every worker will:
    a missing one is then said once, not as each worker's failed startup. Raises
    PolicyLoadError or PolicyError."""
    for policy in load_policy_dir(settings.policy_dir, settings.forward_budget()).values():
        resolve_credentials(policy)


def run(settings: GatewaySettings, ledger: LedgerSettings) -> None:
    """Serve until a signal stops the workers; StartFailed if one failed at start-up.
    `ledger` is `settings.ledger`, built by the caller before it reads any policy."""
    with (
        supervised_redis_url(ledger) as url,
        tempfile.TemporaryDirectory() as metrics,
        tempfile.TemporaryDirectory() as scratch,
    ):
        refusal = Path(scratch) / "refusal"
        os.environ.update(
            {
                "IRREV_REDIS_URL": url,
                "IRREV_POLICY_DIR": str(settings.policy_dir.absolute()),
                REFUSAL_FILE: str(refusal),
            }
        )
        if not settings.instance:
            instance = f"{socket.gethostname()}:{settings.host}:{settings.port}"
            os.environ["IRREV_INSTANCE"] = instance
        if settings.workers > 1:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
        serve_workers(settings, refusal)


def serve_workers(settings: GatewaySettings, refusal: Path) -> None:
    """Run the workers until a signal stops them; StartFailed if one failed at
    start-up. uvicorn.run would return normally for that with several workers (and
    re-raise a SIGTERM with one, skipping our clean-up), hence its supervisor used
    directly."""
    config = Config(
        "gateway.worker:worker_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level="warning",
        access_log=False,
    )
    supervisor = _Workers(config, sockets=[_listen(settings)])
    supervisor.refusal = refusal
    # In-flight forwards may finish (and settle their holds) within the upstream timeout.
    supervisor.grace_s = settings.upstream_timeout_s + SHUTDOWN_MARGIN_S
    supervisor.run()
    if refusal.exists():
        line = refusal.read_text(encoding="utf-8")
        if supervisor.replaced:
            # Not a failed start of the gateway: it served until then.
            line = f"a worker died and the one started in its place could not start: {line}"
        raise StartFailed(line)
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise StartFailed("the gateway workers could not start; their errors are above")


def _listen(settings: GatewaySettings) -> socket.socket:
    """The workers' socket, bound as uvicorn's Config.bind_socket binds it, which logs
    an error without saying what to do and exits itself."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        raise StartFailed(
            f"cannot listen on {settings.host}:{settings.port} ({exc.strerror}): stop what "
            "listens there or choose another address (--host, --port; IRREV_HOST, IRREV_PORT)"
        ) from exc
    sock.set_inheritable(True)
    return sock


class _Workers(Multiprocess):
    """uvicorn's supervisor, except that a worker still shutting down `grace_s` after
    SIGTERM is killed: uvicorn would wait for it forever (a worker was seen stuck in
    its shutdown after its Redis restarted), and with it the release of the embedded
    redis-server. A killed worker is a crash the ledger is built for: its holds in
    flight turn ambiguous at their deadline and the reconciler settles them."""

    grace_s = SHUTDOWN_MARGIN_S
    refusal: Path | None = None
    replaced = 0  # workers that died after they were started and were started again

    def keep_subprocess_alive(self) -> None:
        """A worker that refused to start stops them all (uvicorn would start it again:
        REFUSED is not its STARTUP_FAILURE, which would have it log a line of its own)."""
        if self.refusal is not None and self.refusal.exists():
            self.should_exit.set()
            return
        before = [worker.pid for worker in self.processes]
        super().keep_subprocess_alive()
        self.replaced += sum(
            old != worker.pid for old, worker in zip(before, self.processes, strict=True)
        )

    def join_all(self) -> None:
        deadline = time.monotonic() + self.grace_s
        for worker in self.processes:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                worker.kill()
                worker.join()
