"""Managed keys in Redis (ledger/keystore.py, lua/keys.lua): a key is created with Redis
times, a rotation replaces its hash, a revoked key never comes back, a hash is one
key's at most, bad input is refused before any write, and every write bumps the
fleet's keys epoch and is announced on the change feed."""

from __future__ import annotations

import asyncio
import secrets
import time

import pytest
import redis.asyncio as aioredis

from ledger import BadInput, KeyKind, KeyNotFound, KeyNotLive, KeySpec, KeyState, Ledger
from ledger.changes import CHANNEL
from ledger.keys import key_hashes_key, managed_keys_key

AGENT = KeySpec(
    kind=KeyKind.AGENT, agent="buyer-01", owner="ann@example.com", purpose="nightly run"
)
ADMIN = KeySpec(kind=KeyKind.ADMIN, admin="bob", role="approver", owner="ann", purpose="on call")


def new_hash() -> str:
    return "sha256:" + secrets.token_hex(32)


def new_id() -> str:
    return "key_" + secrets.token_hex(6)


async def test_a_key_is_created_with_redis_times(ledger: Ledger, tenant: str) -> None:
    keys = ledger.keys
    epoch = await keys.epoch()
    before = await keys.now_ms()
    token_hash, key_id = new_hash(), new_id()
    record = await keys.create(tenant, key_id, token_hash, AGENT, expires_in_ms=60_000)
    assert record is not None
    assert (record.key_id, record.tenant, record.spec, record.token_sha256) == (
        key_id,
        tenant,
        AGENT,
        token_hash,
    )
    assert before <= record.created_ms <= await keys.now_ms()
    assert record.expires_ms == record.created_ms + 60_000
    assert record.state(record.created_ms) is KeyState.LIVE
    assert record.state(record.created_ms + 60_000) is KeyState.EXPIRED
    assert await keys.epoch() >= epoch + 1
    admin = await keys.create(tenant, new_id(), new_hash(), ADMIN)
    assert admin is not None and admin.expires_ms is None
    listed = (await keys.records([tenant]))[tenant]
    assert [r.key_id for r in listed] == [key_id, admin.key_id]
    assert listed[1].spec == ADMIN


async def test_a_taken_id_or_hash_writes_nothing(ledger: Ledger, tenant: str) -> None:
    keys = ledger.keys
    token_hash, key_id = new_hash(), new_id()
    assert await keys.create(tenant, key_id, token_hash, AGENT) is not None
    assert await keys.create(tenant, key_id, new_hash(), ADMIN) is None
    with pytest.raises(BadInput, match="another key's"):
        await keys.create(tenant, new_id(), token_hash, AGENT)
    (only,) = (await keys.records([tenant]))[tenant]
    assert only.spec == AGENT and only.token_sha256 == token_hash


async def test_rotate_replaces_the_hash_and_revoke_is_for_good(ledger: Ledger, tenant: str) -> None:
    keys = ledger.keys
    first, key_id = new_hash(), new_id()
    await keys.create(tenant, key_id, first, AGENT)
    second = new_hash()
    rotated = await keys.rotate(tenant, key_id, second)
    assert rotated.token_sha256 == second and rotated.rotated_ms is not None
    live_hashes = ledger.redis.hgetall(key_hashes_key(tenant))
    assert await live_hashes == {second: key_id}
    revoked = await keys.revoke(tenant, key_id)
    assert revoked.revoked_ms is not None and revoked.state(0) is KeyState.REVOKED
    assert await ledger.redis.hgetall(key_hashes_key(tenant)) == {}
    again = await keys.revoke(tenant, key_id)
    assert again.revoked_ms == revoked.revoked_ms  # idempotent: the first time stays
    with pytest.raises(KeyNotLive, match="revoked"):
        await keys.rotate(tenant, key_id, new_hash())
    with pytest.raises(KeyNotFound):
        await keys.revoke(tenant, new_id())
    with pytest.raises(KeyNotFound):
        await keys.rotate(tenant, new_id(), new_hash())


async def test_an_expired_key_is_not_rotated(ledger: Ledger, tenant: str) -> None:
    keys = ledger.keys
    key_id = new_id()
    await keys.create(tenant, key_id, new_hash(), AGENT, expires_in_ms=1)
    deadline = time.monotonic() + 5
    while True:
        try:
            await keys.rotate(tenant, key_id, new_hash())
        except KeyNotLive as exc:
            assert exc.state == "expired"
            break
        assert time.monotonic() < deadline, "a 1 ms key never expired"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("key_id", "token_hash", "spec", "life", "field"),
    [
        ("key_xyz", None, AGENT, None, "key_id"),
        (None, "sha256:abc", AGENT, None, "token_sha256"),
        (None, None, KeySpec(kind=KeyKind.AGENT, agent="a:b"), None, "agent"),
        (None, None, KeySpec(kind=KeyKind.ADMIN, admin="", role="viewer"), None, "admin"),
        (None, None, KeySpec(kind=KeyKind.AGENT, agent="a", owner="x" * 201), None, "owner"),
        (None, None, KeySpec(kind=KeyKind.AGENT, agent="a", purpose="a\nb"), None, "purpose"),
        (None, None, AGENT, 0, "expires_in_ms"),
    ],
    ids=["key-id", "hash", "agent-colon", "no-admin", "long-owner", "control-char", "zero-life"],
)
async def test_bad_input_is_refused_before_any_write(
    ledger: Ledger,
    tenant: str,
    key_id: str | None,
    token_hash: str | None,
    spec: KeySpec,
    life: int | None,
    field: str,
) -> None:
    with pytest.raises(BadInput) as refused:
        await ledger.keys.create(
            tenant, key_id or new_id(), token_hash or new_hash(), spec, expires_in_ms=life
        )
    assert refused.value.field == field
    assert (await ledger.keys.records([tenant]))[tenant] == []


async def test_the_script_checks_its_arguments_itself(ledger: Ledger, tenant: str) -> None:
    """A caller that skips the Python checks still writes nothing malformed."""
    script = ledger.redis.register_script(ledger.keys._script.script)
    keys = [managed_keys_key(tenant), key_hashes_key(tenant)]
    for args in (
        ["create", new_id(), "sha256:nothex", "{}", ""],
        ["create", new_id(), new_hash(), "not json", ""],
        ["create", new_id(), new_hash(), "{}", "-5"],
        ["rotate", new_id(), "nope"],
        ["drop", new_id()],
    ):
        reply = await script(keys=keys, args=args)
        assert reply[0] == "bad_input", (args, reply)
    assert await ledger.redis.exists(*keys) == 0


async def test_a_damaged_record_hides_no_other(ledger: Ledger, tenant: str) -> None:
    key_id = new_id()
    await ledger.keys.create(tenant, key_id, new_hash(), AGENT)
    await ledger.redis.hset(managed_keys_key(tenant), "key_000000000000", "{not json")
    listed = (await ledger.keys.records([tenant]))[tenant]
    assert [r.key_id for r in listed] == [key_id]


async def test_last_used_is_flushed_in_one_batch(ledger: Ledger, tenant: str) -> None:
    keys = ledger.keys
    ids = [new_id(), new_id()]
    for key_id in ids:
        await keys.create(tenant, key_id, new_hash(), AGENT)
    await keys.touch({tenant: {ids[0]: 1234, ids[1]: 5678}})
    listed = (await keys.records([tenant]))[tenant]
    assert {r.key_id: r.last_used_ms for r in listed} == {ids[0]: 1234, ids[1]: 5678}
    unused = (await keys.records([tenant], last_used=False))[tenant]
    assert [r.last_used_ms for r in unused] == [None, None]


async def test_every_write_is_announced(ledger: Ledger, tenant: str, redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    await pubsub.subscribe(CHANNEL)
    try:
        key_id = new_id()
        await ledger.keys.create(tenant, key_id, new_hash(), AGENT)
        await ledger.keys.rotate(tenant, key_id, new_hash())
        await ledger.keys.revoke(tenant, key_id)
        heard = 0  # other tests' writes may be announced too: at least these three
        deadline = time.monotonic() + 10
        while heard < 3 and time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            heard += message is not None and message["data"] == b"keys"
        assert heard >= 3
    finally:
        await pubsub.aclose()
        await client.aclose()
