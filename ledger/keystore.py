"""Managed keys: agent and admin credentials kept in Redis beside a tenant's ledger
(`irrev:{tenant}:keys`), created, rotated and revoked while gateways run, instead of
`token_sha256` lines in its policy file. Only a token's hash is stored; the token is
made and shown once by whoever creates or rotates the key.

A write is one script (lua/keys.lua) on the tenant's slot; then, as for the policy
store, the fleet's keys epoch is bumped and the write announced ('keys' on the change
feed), so every gateway reloads its keys at once. A bump or announcement that fails
after the write is logged, not raised: the gateways' periodic full read finds it.
When each key was last used is written by the gateways in batches (`touch`), never
per request; it is for operators to read, and decides nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from typing import Any

from . import validate
from .changes import announce, bump_epoch, tell
from .cluster import RedisClient
from .errors import BadInput, KeyNotFound, KeyNotLive, translate_redis_errors
from .keys import (
    KEYS_EPOCH_KEY,
    key_hashes_key,
    keys_used_key,
    keys_version_key,
    managed_keys_key,
)
from .topology import topology_of

log = logging.getLogger("irrev.ledger")
KEY_ID = re.compile(r"key_[0-9a-f]{12}")
TOKEN_HASH = re.compile(r"sha256:[0-9a-f]{64}")
MAX_TEXT_CHARS = 200
# A year: a key meant to live longer is one meant never to expire (omit it).
MAX_LIFETIME_MS = 366 * 24 * 3600 * 1000


class KeyKind(StrEnum):
    AGENT = "agent"
    ADMIN = "admin"


class KeyState(StrEnum):
    LIVE = "live"
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeySpec:
    """What a new key is: an agent's credential (`agent`) or an admin's (`admin` and
    `role`), who asked for it (`owner`) and why (`purpose`)."""

    kind: KeyKind
    agent: str = ""
    admin: str = ""
    role: str = ""
    owner: str = ""
    purpose: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRecord:
    """A managed key as stored. Times are Redis ms; None: never (expires, rotated,
    revoked) or not known yet (last_used, flushed by gateways every few seconds)."""

    key_id: str
    tenant: str
    spec: KeySpec
    token_sha256: str
    created_ms: int
    expires_ms: int | None
    rotated_ms: int | None
    revoked_ms: int | None
    last_used_ms: int | None = None

    def state(self, now_ms: int) -> KeyState:
        if self.revoked_ms is not None:
            return KeyState.REVOKED
        if self.expires_ms is not None and now_ms >= self.expires_ms:
            return KeyState.EXPIRED
        return KeyState.LIVE


class KeyStore:
    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        self.topology = topology_of(redis)
        source = files("ledger.lua").joinpath("keys.lua").read_text(encoding="utf-8")
        self._script = redis.register_script(source)

    async def epoch(self) -> int:
        """The fleet's keys epoch (lua/epoch.lua): unchanged, no key changed."""
        with translate_redis_errors("reading the keys epoch"):
            return int(await self.redis.get(KEYS_EPOCH_KEY) or 0)

    async def versions(self, tenants: Sequence[str]) -> dict[str, int]:
        """The keys version of each of `tenants` that had a key write (moved by each
        to a value it never held, lua/keys.lua), in one round trip: what the fleet's
        watcher compares every so often."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        if not names:
            return {}
        with translate_redis_errors("reading managed keys versions"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in names:
                    pipe.get(keys_version_key(tenant))
                replies = await pipe.execute()
        return {tenant: int(v) for tenant, v in zip(names, replies, strict=True) if v}

    async def bump(self) -> None:
        """Bump the keys epoch and announce it, for a write whose own bump may have
        been lost: every gateway then reloads the keys of its tenants."""
        with translate_redis_errors("bumping the keys epoch"):
            await bump_epoch(self.redis, KEYS_EPOCH_KEY)
        await announce(self.redis, "keys")

    async def now_ms(self) -> int:
        """Redis's clock (TIME), the one every key's times are in."""
        with translate_redis_errors("reading Redis time"):
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def records(
        self, tenants: Sequence[str], *, last_used: bool = True
    ) -> dict[str, list[KeyRecord]]:
        """Every key of `tenants` (revoked ones too), by tenant, oldest first, in one
        round trip; without `last_used` (what a gateway's reload needs: half the
        reads) their `last_used_ms` are None."""
        names = [validate.tenant_id(tenant) for tenant in tenants]
        if not names:
            return {}
        with translate_redis_errors("reading managed keys"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant in names:
                    pipe.hgetall(managed_keys_key(tenant))
                    if last_used:
                        pipe.hgetall(keys_used_key(tenant))
                replies = iter(await pipe.execute())
        out = {}
        for tenant in names:
            stored = next(replies)
            used = {_text(k): int(_text(v)) for k, v in next(replies).items()} if last_used else {}
            records = [r for v in stored.values() if (r := _readable(tenant, _text(v), used))]
            out[tenant] = sorted(records, key=lambda r: (r.created_ms, r.key_id))
        return out

    async def create(
        self,
        tenant: str,
        key_id: str,
        token_sha256: str,
        spec: KeySpec,
        expires_in_ms: int | None = None,
    ) -> KeyRecord | None:
        """Store a new key; None if `key_id` is taken (make another id and call
        again). BadInput if the hash is another key's."""
        fields = {
            "tenant": validate.tenant_id(tenant),
            "kind": KeyKind(spec.kind).value,
            "agent": _member("agent", spec.agent) if spec.kind is KeyKind.AGENT else "",
            "admin": _member("admin", spec.admin) if spec.kind is KeyKind.ADMIN else "",
            "role": _member("role", spec.role) if spec.kind is KeyKind.ADMIN else "",
            "owner": _text_field("owner", spec.owner),
            "purpose": _text_field("purpose", spec.purpose),
        }
        if expires_in_ms is not None and not 0 < expires_in_ms <= MAX_LIFETIME_MS:
            raise BadInput("expires_in_ms", f"must be 1 to {MAX_LIFETIME_MS} ms (a year)")
        life = "" if expires_in_ms is None else str(expires_in_ms)
        args = ["create", _key_id(key_id), _hash(token_sha256), json.dumps(fields), life]
        status, body = await self._call(tenant, args)
        if status == "exists":
            return None
        return await self._told(self._outcome(tenant, key_id, status, body))

    async def rotate(self, tenant: str, key_id: str, token_sha256: str) -> KeyRecord:
        """Give the key a new token hash: the old token stops working (KeyNotLive for
        a revoked or expired key, KeyNotFound for none)."""
        args = ["rotate", _key_id(key_id), _hash(token_sha256)]
        return await self._told(self._outcome(tenant, key_id, *await self._call(tenant, args)))

    async def revoke(self, tenant: str, key_id: str) -> KeyRecord:
        """Revoke the key for good; revoking a revoked key changes nothing."""
        reply = await self._call(tenant, ["revoke", _key_id(key_id)])
        return await self._told(self._outcome(tenant, key_id, *reply))

    async def touch(self, used: Mapping[str, Mapping[str, int]]) -> None:
        """Record when keys were last used: tenant -> key id -> Redis ms, one HSET per
        tenant in one round trip."""
        if not used:
            return
        with translate_redis_errors("recording when keys were used"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for tenant, stamps in used.items():
                    if stamps:
                        pairs = [part for item in stamps.items() for part in item]
                        pipe.hset(keys_used_key(validate.tenant_id(tenant)), items=pairs)
                await pipe.execute()

    async def _call(self, tenant: str, args: list[str]) -> tuple[str, str]:
        name = validate.tenant_id(tenant)
        keys = [managed_keys_key(name), key_hashes_key(name), keys_version_key(name)]
        with translate_redis_errors(f"writing a managed key ({args[0]})"):
            reply = await self.topology.through_migration(
                lambda: self._script(keys=keys, args=args)
            )
        parts = [_text(part) for part in reply]
        if parts[0] == "bad_input":
            raise BadInput(parts[1], parts[2])
        return parts[0], parts[1]

    def _outcome(self, tenant: str, key_id: str, status: str, body: str) -> KeyRecord:
        if status == "not_found":
            raise KeyNotFound(tenant, key_id)
        if status == "hash_taken":
            raise BadInput("token_sha256", "the hash is another key's: make a new token")
        if status in ("revoked", "expired"):
            raise KeyNotLive(key_id, status)
        return _record(tenant, body, {})

    async def _told(self, record: KeyRecord) -> KeyRecord:
        """`record`, once the keys epoch is bumped and the write announced
        (changes.tell: a failure is logged, not raised)."""
        await tell(self.redis, KEYS_EPOCH_KEY, "keys")
        return record


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional_ms(value: Any) -> int | None:
    return None if value is None else int(value)


def _readable(tenant: str, text: str, used: Mapping[str, int]) -> KeyRecord | None:
    """The record, or None (logged) if it is not one keys.lua wrote: one damaged
    record must not stop a gateway reloading the others (and their revocations)."""
    try:
        return _record(tenant, text, used)
    except (ValueError, KeyError, TypeError):
        log.error("a managed key's record is unreadable; skipped", extra={"tenant": tenant})
        return None


def _record(tenant: str, text: str, used: Mapping[str, int]) -> KeyRecord:
    data = json.loads(text)
    spec = KeySpec(
        kind=KeyKind(data["kind"]),
        agent=data.get("agent", ""),
        admin=data.get("admin", ""),
        role=data.get("role", ""),
        owner=data.get("owner", ""),
        purpose=data.get("purpose", ""),
    )
    return KeyRecord(
        key_id=data["id"],
        tenant=tenant,
        spec=spec,
        token_sha256=data["token_sha256"],
        created_ms=int(data["created_ms"]),
        expires_ms=_optional_ms(data.get("expires_ms")),
        rotated_ms=_optional_ms(data.get("rotated_ms")),
        revoked_ms=_optional_ms(data.get("revoked_ms")),
        last_used_ms=used.get(data["id"]),
    )


def _key_id(value: str) -> str:
    if not KEY_ID.fullmatch(value):
        raise BadInput("key_id", "must be key_ and 12 hex digits, as the key list shows")
    return value


def _hash(value: str) -> str:
    if not TOKEN_HASH.fullmatch(value):
        raise BadInput("token_sha256", "must be sha256:<64 lowercase hex>")
    return value


def _member(field: str, value: str) -> str:
    validate.identifier(field, value)
    if ":" in value:
        raise BadInput(field, "must not hold ':' (it names an agent, admin or role)")
    return value


def _text_field(field: str, value: str) -> str:
    if len(value) > MAX_TEXT_CHARS or not value.isprintable():
        raise BadInput(field, f"must be at most {MAX_TEXT_CHARS} printable characters")
    return value
