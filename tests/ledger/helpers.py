"""Small helpers shared by the ledger tests."""

from __future__ import annotations

from ledger.client import Ledger
from ledger.keys import accounts_key, tenant_prefix


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
