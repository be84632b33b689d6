"""Why a policy change was refused (docs/design.md, "Policy changes": every change
names the version it
was made from, and never goes whole over a newer one). Each refusal is typed, with
the HTTP status and reason code the admin API answers it with and words that say
what to do."""

from __future__ import annotations


class ChangeRefused(Exception):
    status = 409
    reason = "policy_conflict"

    def __init__(self, detail: str, current: int, fields: list[str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.current = current  # the store's version now: what to read and start from
        self.fields = fields or []


class BaseRequired(ChangeRefused):
    status = 428
    reason = "base_required"


class UnknownVersion(ChangeRefused):
    status = 412
    reason = "unknown_version"


class VersionForgotten(ChangeRefused):
    status = 412
    reason = "version_forgotten"


class PolicyContended(ChangeRefused):
    status = 409
    reason = "policy_conflict"


def base_required(current: int) -> BaseRequired:
    return BaseRequired(
        "say which version this policy was made from: GET it, edit it and send it back "
        f"with If-Match set to its ETag (the store holds version {current} now)",
        current,
    )


def unknown_version(base: int, current: int) -> UnknownVersion:
    return UnknownVersion(
        f"version {base} was never stored (the store holds version {current}): GET the "
        "policy and send your change with If-Match set to its ETag",
        current,
    )


def version_forgotten(base: int, current: int, kept: int) -> VersionForgotten:
    return VersionForgotten(
        f"version {base} is older than the {kept} versions the store keeps (it holds "
        f"version {current}): GET the policy, make your change again and send it with "
        "If-Match set to its ETag",
        current,
    )


def contended(base: int, current: int, fields: list[str]) -> PolicyContended:
    return PolicyContended(
        f"since version {base}, which this change was made from, version {current} "
        f"changed {', '.join(fields)} to other values than this change sets; nothing "
        "was applied: GET the policy, decide those fields again and send it with "
        "If-Match set to its ETag",
        current,
        fields,
    )


def busy(current: int) -> PolicyContended:
    return PolicyContended(
        "the policy changed several times while this change was written; send it again",
        current,
    )
