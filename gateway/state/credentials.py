"""What the gateway adds to a tool's requests, read from environment variables or
secret files when policies are loaded: the headers an HTTP upstream requires
(`tools.<name>.credentials`), or the environment of a stdio MCP server the gateway
runs (`tools.<name>.mcp_env`); and the tenant's webhook signing secret
(`webhook.secret`).

They exist only here and in outgoing headers or a child process's environment: never
in a policy, a hold's stored request, the journal, a log line, a metric, a command
line or an answer to an agent. An error names the variable or file, never what it
holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pricing import Finding, PolicyError, SecretSource, TenantPolicy

Injected = tuple[tuple[str, str], ...]


def resolve_credentials(policy: TenantPolicy) -> dict[str, Injected]:
    """tool name -> the headers to add to its requests, or for a stdio MCP server the
    variables to add to its environment; PolicyError names every variable or file
    that is missing, unreadable or not a valid header (or environment) value."""
    resolved: dict[str, Injected] = {}
    findings: list[Finding] = []
    for tool_name, tool in policy.document.tools.items():
        injected = []
        for header, secret in tool.credentials.items():
            value, problem = _read(secret)
            if problem:
                findings.append(Finding(f"tools.{tool_name}.credentials.{header}", problem))
            else:
                injected.append((header, secret.prefix + value))
        for name, source in tool.mcp_env.items():
            if isinstance(source, str):
                injected.append((name, source))
                continue
            value, problem = _read_raw(source)
            if problem:
                findings.append(Finding(f"tools.{tool_name}.mcp_env.{name}", problem))
            else:
                injected.append((name, value))
        if injected:
            resolved[tool_name] = tuple(injected)
    if policy.document.webhook is not None:
        _, problem = _read(policy.document.webhook.secret)
        if problem:
            findings.append(Finding("webhook.secret", problem))
    if findings:
        raise PolicyError(f"credentials of tenant {policy.tenant}", findings)
    return resolved


def secret_files_signature(policies: Iterable[TenantPolicy]) -> tuple[tuple[str, int, int], ...]:
    """The secret files `policies` read, each with its time and size: a file rotated
    since is a reload's cue (every worker then reads the new secret)."""
    paths = {
        secret.file
        for policy in policies
        for tool in policy.document.tools.values()
        for secret in [*tool.credentials.values(), *tool.mcp_env.values()]
        if isinstance(secret, SecretSource) and secret.file
    }
    signature = []
    for path in sorted(paths):
        try:
            stat = os.stat(path)
        except OSError:
            signature.append((path, 0, -1))
        else:
            signature.append((path, stat.st_mtime_ns, stat.st_size))
    return tuple(signature)


def webhook_secret(policy: TenantPolicy) -> bytes | None:
    """The tenant's webhook signing secret as it is now, None without a webhook;
    PolicyError (naming the variable or file, never the value) if it cannot be read."""
    webhook = policy.document.webhook
    if webhook is None:
        return None
    value, problem = _read(webhook.secret)
    if problem:
        raise PolicyError(
            f"credentials of tenant {policy.tenant}", [Finding("webhook.secret", problem)]
        )
    return value.encode()


def _read(secret: SecretSource) -> tuple[str, str]:
    """(value, "") or ("", what is wrong), without the value: one a header can carry."""
    value, problem = _read_raw(secret)
    if problem:
        return "", problem
    if not all(" " <= c <= "~" or c == "\t" for c in value):
        return "", f"{secret.source} holds characters a header value cannot"
    return value, ""


def _read_raw(secret: SecretSource) -> tuple[str, str]:
    """(value, "") or ("", what is wrong): a non-empty value without NUL, which no
    header or environment can carry."""
    if secret.env is not None:
        value = os.environ.get(secret.env)
        if value is None:
            return "", f"environment variable {secret.env!r} is not set"
    else:
        assert secret.file is not None
        try:
            # A trailing newline is how editors and `echo` end files, not part of a token.
            value = Path(secret.file).read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            return "", f"cannot read file {secret.file!r}: {type(exc).__name__}"
    if not value or "\x00" in value:
        return "", f"{secret.source} is empty or holds a NUL character"
    return value, ""
