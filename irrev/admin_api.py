"""A running gateway's admin API, as the commands that drive it call it (`irrev policy
pull|push|diff|history`, `irrev escalations`, `irrev holds`): where the gateway is
(--gateway, else IRREV_GATEWAY_URL), whose admin token (the variable --token-env names,
IRREV_ADMIN_TOKEN by default: a token never goes on a command line, where `ps` and
shell histories show it), and a refusal as one line naming the gateway's reason code.
The gateway checks the token's role; these commands check nothing it would not."""

from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import quote

import httpx

from irrev.cli import CliError

GATEWAY_ENV = "IRREV_GATEWAY_URL"
TOKEN_ENV = "IRREV_ADMIN_TOKEN"
DEFAULT_GATEWAY = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0  # an approval waits for its forward: the upstream's timeout and more


class Refused(CliError):
    """The gateway refused the call (exit 1: checked and found wrong)."""

    exit_code = 1


def add_connection(parser: argparse.ArgumentParser) -> None:
    """--gateway, --token-env and --json, as every admin API command takes them."""
    parser.add_argument(
        "--gateway",
        default=os.environ.get(GATEWAY_ENV, DEFAULT_GATEWAY),
        help=f"the gateway's URL ({GATEWAY_ENV}, default {DEFAULT_GATEWAY})",
    )
    parser.add_argument(
        "--token-env",
        default=TOKEN_ENV,
        metavar="NAME",
        help=f"the environment variable holding an admin token (default {TOKEN_ENV})",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def connect(args: argparse.Namespace) -> httpx.Client:
    token = os.environ.get(args.token_env, "")
    if not token:
        raise CliError(f"set {args.token_env} to an admin token of the gateway")
    return httpx.Client(
        base_url=args.gateway,
        headers={"Authorization": f"Bearer {token}"},
        timeout=TIMEOUT_S,
        trust_env=False,
    )


def path(*segments: str) -> str:
    """An API path from segments a person typed, each quoted whole: a `/`, `?` or `..`
    in an id names nothing else on the gateway, it is only not found."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


def send(client: httpx.Client, method: str, url: str, **options: Any) -> httpx.Response:
    """The gateway's answer, whatever its status; one that cannot be had is a CliError."""
    try:
        return client.request(method, url, **options)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the gateway at {client.base_url}: {exc}") from None


def call(client: httpx.Client, method: str, url: str, **options: Any) -> httpx.Response:
    """`send`, and a status of 400 or more raised as Refused, saying why."""
    response = send(client, method, url, **options)
    if response.status_code >= 400:
        raise Refused(refusal(response))
    return response


def refusal(response: httpx.Response) -> str:
    """A refused call as the gateway said it, on one line: its reason code and detail,
    who decided first (a lost race), the fields a 422 names; then a refused policy's
    problems, one a line below it."""
    problem = json_or_none(response)
    if not isinstance(problem, dict) or "reason" not in problem:
        return f"HTTP {response.status_code} from {response.request.url}"
    # A detail is one sentence or two; whitespace folded, it stays on its line.
    said = f"{problem['reason']}: {' '.join(str(problem.get('detail', '')).split())}"
    if problem.get("by"):
        said += f" (by {problem['by']})"
    errors = problem.get("errors") or []
    said += "".join(f"; {e.get('field')}: {e.get('message')}" for e in errors)
    return said + "".join(f"\n  {line}" for line in problem.get("problems", []))


def json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def json_of(response: httpx.Response) -> Any:
    """The answer's JSON; an answer without any (something else at that URL) is a
    CliError, before anything is printed or written."""
    body = json_or_none(response)
    if body is None:
        raise CliError(f"{response.request.url} answered without JSON: is it an irrev gateway?")
    return body
