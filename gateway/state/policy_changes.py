"""Why a policy change was refused (docs/design.md, "Policy changes": every change
names the version it
was made from, and never goes whole over a newer one). Each refusal is typed, with
the HTTP status and reason code the admin API answers it with and words that say
what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoreVersion:
    """A version of a tenant's policy in the fleet's store as its ETag names it: its
    number and the digest of its text. The number alone does not name it: a
    failover that lost version 7 lets the new primary write another version 7, and
    a change made from the lost one must not pass for one made from the other.
    `NO_VERSION` (0, ''): the store holds none."""

    number: int
    digest: str

    @property
    def etag(self) -> str:
        return f'"{self.number}-{self.digest}"'


NO_VERSION = StoreVersion(0, "")


class ChangeRefused(Exception):
    status = 409
    reason = "policy_conflict"

    def __init__(self, detail: str, current: StoreVersion, fields: list[str] | None = None) -> None:
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


def base_required(current: StoreVersion) -> BaseRequired:
    return BaseRequired(
        "say which version this policy was made from: GET it, edit it and send it back "
        f"with If-Match set to its ETag (the store holds version {current.number} now)",
        current,
    )


def unknown_version(base: StoreVersion, current: StoreVersion) -> UnknownVersion:
    return UnknownVersion(
        f"the store holds no version {base.etag} (it holds {current.etag}): it was never "
        "stored, or a Redis failover lost it and another version took its number; GET "
        "the policy, make your change again from it and send it with If-Match set to "
        "its ETag",
        current,
    )


def version_forgotten(base: StoreVersion, current: StoreVersion, kept: int) -> VersionForgotten:
    return VersionForgotten(
        f"version {base.number} is older than the {kept} versions the store keeps (it "
        f"holds version {current.number}): GET the policy, make your change again and "
        "send it with If-Match set to its ETag",
        current,
    )


def contended(base: StoreVersion, current: StoreVersion, fields: list[str]) -> PolicyContended:
    return PolicyContended(
        f"since version {base.number}, which this change was made from, version "
        f"{current.number} changed {', '.join(fields)} to other values than this change "
        "sets; nothing was applied: GET the policy, decide those fields again and send "
        "it with If-Match set to its ETag",
        current,
        fields,
    )


def busy(current: StoreVersion) -> PolicyContended:
    return PolicyContended(
        "the policy changed several times while this change was written; send it again",
        current,
    )
