"""`irrev serve`: the gateway under uvicorn, with one or more worker processes that
share one Redis (the configured one, or an embedded one this process starts)."""

from __future__ import annotations

import argparse
import os
import tempfile

import uvicorn

from ledger.embedded import redis_url
from pricing import PolicyError

from .cli import CliError
from .credentials import resolve_credentials
from .policies import PolicyLoadError, load_policy_dir
from .settings import GatewaySettings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("serve", help="run the gateway (settings: IRREV_* variables)")
    parser.add_argument("--host", help="bind address (IRREV_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (IRREV_PORT, default 8080)")
    parser.add_argument("--workers", type=int, help="worker processes (IRREV_WORKERS)")
    parser.add_argument("--policy-dir", help="tenant policies (IRREV_POLICY_DIR)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "policy_dir": args.policy_dir,
    }
    settings = GatewaySettings(**{k: v for k, v in overrides.items() if v is not None})
    ledger = settings.ledger  # a bad IRREV_* setting is named before any policy is read
    try:
        # Every worker resolves the tools' credentials when it loads the policies: a
        # missing one is said here, in one line, not as each worker's failed startup.
        for policy in load_policy_dir(settings.policy_dir).values():
            resolve_credentials(policy)
    except (PolicyLoadError, PolicyError) as exc:
        raise CliError(f"the policies in {settings.policy_dir} cannot be used:\n{exc}") from exc
    with redis_url(ledger) as url, tempfile.TemporaryDirectory() as metrics_dir:
        os.environ.update(
            {
                "IRREV_REDIS_URL": url,
                "IRREV_POLICY_DIR": str(settings.policy_dir.absolute()),
            }
        )
        if settings.workers > 1:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        uvicorn.run(
            "gateway.app:app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level="warning",
            access_log=False,
        )
    return 0
