"""`irrev serve`: the gateway's workers (gateway/serve.py) with settings from IRREV_*
variables and these flags. A start refusal (bad settings, policies that cannot be used,
an address in use, an embedded redis-server that cannot start, a Redis the workers
cannot reach or that cannot keep the durability asked for) is one line on stderr and
exit code 2, as any CliError; so is a worker that failed otherwise (its traceback above
that line)."""

from __future__ import annotations

import argparse

from gateway.serve import StartFailed, check_policies, one_line
from gateway.serve import run as serve
from gateway.settings import GatewaySettings
from gateway.state.policies import PolicyLoadError
from irrev.cli import CliError
from pricing import PolicyError

# What a first run cannot do without, in `--help`: a person starting a gateway for the
# first time reads this, not the settings modules.
FIRST_RUN = """\
a first run needs these environment variables (the flags above override their own):
  IRREV_ADMIN_TOKENS  operators' admin tokens, name=token pairs, comma-separated: the
                      admin API, the console, `irrev escalations` and `irrev holds`
                      (unset: only the tenant admins that policies list)
  IRREV_REDIS_URL     the fleet's Redis: redis://, rediss:// or unix:// (unset: an
                      embedded redis-server, for one machine)
  IRREV_DATA_DIR      where that embedded server keeps its append-only file
                      (default ~/.local/share/irrev)
  IRREV_POLICY_DIR    tenant policy files (or --policy-dir; default ./examples)

every other IRREV_* setting, its default and what it does: docs/settings.md
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FIRST_RUN
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
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
        check_policies(settings)
    except (PolicyLoadError, PolicyError) as exc:
        problems = one_line(str(exc))
        raise CliError(f"the policies in {settings.policy_dir} cannot be used: {problems}") from exc
    try:
        serve(settings, ledger)
    except StartFailed as exc:
        raise CliError(str(exc)) from exc
    return 0
