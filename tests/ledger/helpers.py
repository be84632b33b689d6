"""Small helpers shared by the ledger tests."""

from __future__ import annotations

from ledger.client import Ledger
from ledger.keys import accounts_key, hold_key, payload_key, settled_key, tenant_prefix
from ledger.records import Hold
from ledger.replies import decoded


async def tenant_snapshot(ledger: Ledger, tenant: str) -> dict[str, object]:
    """Every key of the tenant with its full contents: equal snapshots before and after
    an operation prove it wrote nothing."""
    snapshot: dict[str, object] = {}
    pattern = tenant_prefix(tenant).replace("{", "\\{").replace("}", "\\}") + "*"
    async for key in ledger.redis.scan_iter(match=pattern, count=1000):
        kind = await ledger.redis.type(key)
        if kind == "hash":
            snapshot[key] = await ledger.redis.hgetall(key)
        elif kind == "stream":
            snapshot[key] = await ledger.redis.xrange(key)
        elif kind == "zset":
            snapshot[key] = await ledger.redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            snapshot[key] = sorted(await ledger.redis.smembers(key))
        else:
            snapshot[key] = kind
    return snapshot


async def server_ms(ledger: Ledger) -> int:
    seconds, micros = await ledger.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def tamper_account(ledger: Ledger, tenant: str, account: str, field: str, by: int) -> None:
    """Change one stored number of an account behind the scripts' back (what a bug or
    an operator's hand edit would do): the audit must notice."""
    await ledger.redis.hincrby(accounts_key(tenant), f"{account}|{field}", by)


async def settled_entry(ledger: Ledger, tenant: str, hold_id: str) -> tuple[str, str]:
    """An archived hold's entry in the settled index: (when its copy expires, in ms or
    "0" for never; the digest its copy is kept under)."""
    entry: str = await decoded(ledger.redis.hget(settled_key(tenant), hold_id))
    expiry, dg = entry.split("|")
    return expiry, dg


async def hold_record(ledger: Ledger, tenant: str, hold_id: str) -> tuple[dict[str, str], str]:
    """A live hold's record as Redis holds it: its fields and its payload ("" if none)."""
    fields: dict[str, str] = await decoded(ledger.redis.hgetall(hold_key(tenant, hold_id)))
    payload: str | None = await decoded(ledger.redis.get(payload_key(tenant, hold_id)))
    return fields, payload or ""


async def stored_hold(ledger: Ledger, tenant: str, hold_id: str) -> Hold:
    """The record of a hold the test made (none is a failure of the test's own)."""
    hold = await ledger.hold(tenant, hold_id)
    assert hold is not None, f"no hold {hold_id} of {tenant}"
    return hold
