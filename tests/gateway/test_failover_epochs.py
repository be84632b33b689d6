"""A failover that loses the last write to the keys or the policy store must not hide
the next write from the hosts that read the lost one (lua/epoch.lua). Hosts reload
when an epoch differs from the one they read last; with a counter, the first bump on
the new primary gave the lost write's value again, for other contents, and a host
that had read it kept serving a key or a token revoked after the failover.

Real servers: a primary and its replica; the replica is cut off (REPLICAOF NO ONE)
after it has the base state, one write lands on the old primary only, and the host,
which read that write, then talks to the replica as the new primary."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import redis
import yaml

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.state.keyring import Keyring
from gateway.state.tenants import TenantStore
from ledger import ChangeFeed, KeyKind, KeySpec, Ledger
from pricing.credentials import hash_token
from tests.conftest import ReplicatedRedis

from .helpers import assert_problem
from .servers import write_policy
from .test_policy_changes import as_stored, with_tenant_limit

AGENT = KeySpec(kind=KeyKind.AGENT, agent="buyer-01", owner="ops")


class HeardFeed(ChangeFeed):
    """A live change feed on which the fleet's watcher beats (never started: what it
    hears is said by the test): the host reloads only when told, and `told()` is one
    more announcement heard."""

    def __init__(self) -> None:
        super().__init__("redis://127.0.0.1:9")
        self.count = 0

    @property
    def live(self) -> bool:
        return True

    @property
    def watched(self) -> bool:
        return True

    def heard(self, *kinds: str) -> int:
        return self.count

    def told(self) -> None:
        self.count += 1


def fail_over(pair: ReplicatedRedis) -> None:
    """The replica has everything written so far, then stops following the primary
    (which goes on taking writes the replica never gets)."""
    assert redis.Redis.from_url(pair.primary.url).execute_command("WAIT", 1, 5000) == 1
    redis.Redis.from_url(pair.replica.url).execute_command("REPLICAOF", "NO", "ONE")


async def new_key(ledger: Ledger, tenant: str) -> tuple[str, str]:
    key_id, token_hash = f"key_{secrets.token_hex(6)}", f"sha256:{secrets.token_hex(32)}"
    assert await ledger.keys.create(tenant, key_id, token_hash, AGENT) is not None
    return key_id, token_hash


async def test_a_key_revoked_after_a_failover_that_lost_a_key_write_is_refused(
    replicated_redis: ReplicatedRedis, tenant: str
) -> None:
    old = Ledger.from_url(replicated_redis.primary.url)
    new = Ledger.from_url(replicated_redis.replica.url)
    try:
        revoked, revoked_hash = await new_key(old, tenant)
        fail_over(replicated_redis)
        _, lost_hash = await new_key(old, tenant)
        ring, feed = Keyring(), HeardFeed()
        await ring.reload(old, frozenset({tenant}))
        assert ring.find(revoked_hash) is not None and ring.find(lost_hash) is not None
        await new.keys.revoke(tenant, revoked)
        feed.told()
        assert await ring.refresh(new, [tenant], feed, 30.0, 30.0)
        assert ring.find(revoked_hash) is None
        assert ring.find(lost_hash) is None
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_token_revoked_after_a_failover_that_lost_a_policy_write_is_refused(
    replicated_redis: ReplicatedRedis, tenant: str, tmp_path: Path
) -> None:
    old = Ledger.from_url(replicated_redis.primary.url)
    new = Ledger.from_url(replicated_redis.replica.url)
    try:
        made = write_policy(tmp_path / "h", "procurement", tenant, "http://127.0.0.1:9")
        token = made.tokens["buyer-01"]
        host = TenantStore(tmp_path / "h", instance="host-b")
        await host.load(old)
        fail_over(replicated_redis)
        v1 = (await old.policies.records([tenant]))[tenant]
        document = yaml.safe_load(v1.text)
        document["accounts"]["tenant"]["limit"] = "1234"
        lost = yaml.safe_dump(document, sort_keys=False)
        await TenantStore(tmp_path / "h", instance="host-a").upload(
            old, tenant, lost, as_stored(v1), "a"
        )
        feed = HeardFeed()
        feed.told()
        await host.refresh(old, feed, 30.0, 30.0)
        served = host.served(tenant)
        assert served is not None and served.version == 2
        assert host.authenticate(token) is not None
        document = yaml.safe_load(v1.text)
        document["agents"]["buyer-01"]["token_sha256"] = hash_token("revoked")
        revoking = yaml.safe_dump(document, sort_keys=False)
        admin = TenantStore(tmp_path / "h", instance="host-c")
        await admin.load(new)
        await admin.upload(new, tenant, revoking, as_stored(v1), "c")
        assert admin.authenticate(token) is None
        feed.told()
        await host.refresh(new, feed, 30.0, 30.0)
        assert host.authenticate(token) is None
    finally:
        await old.aclose()
        await new.aclose()


@asynccontextmanager
async def admin_api(url: str, policies: Path, token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway on `url` in this process, and an admin's client of it."""
    settings = GatewaySettings(policy_dir=policies, admin_tokens=f"ops={token}")
    app = create_app(settings, url)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=headers) as http,
    ):
        yield http


async def test_an_upload_made_from_a_version_a_failover_lost_is_refused(
    replicated_redis: ReplicatedRedis, tenant: str, tmp_path: Path
) -> None:
    """Version 2 lands on the old primary only; the new primary's own version 2
    revokes a token. An upload made from the lost version 2 names it by its ETag: were
    that its number alone, the new version 2 would match, and the upload would put
    the revoked token back with no conflict said."""
    write_policy(tmp_path / "p", "procurement", tenant, "http://127.0.0.1:9")
    admin_token = secrets.token_urlsafe(16)
    url = f"/v1/admin/tenants/{tenant}/policy"
    yaml_only = {"Accept": "application/yaml"}
    async with admin_api(replicated_redis.primary.url, tmp_path / "p", admin_token) as old:
        fail_over(replicated_redis)
        v1 = await old.get(url, headers=yaml_only)
        raised = with_tenant_limit(v1.text, "4321")
        lost = await old.put(url, content=raised, headers={"If-Match": v1.headers["etag"]})
        assert lost.status_code == 200 and lost.json()["version"] == 2, lost.text
        made_from_lost = (await old.get(url, headers=yaml_only)).headers["etag"]
    async with admin_api(replicated_redis.replica.url, tmp_path / "p", admin_token) as new:
        shown = await new.get(url, headers=yaml_only)
        document = yaml.safe_load(shown.text)
        document["agents"]["buyer-01"]["token_sha256"] = hash_token("revoked")
        revoking = yaml.safe_dump(document, sort_keys=False)
        revoked = await new.put(url, content=revoking, headers={"If-Match": shown.headers["etag"]})
        assert revoked.status_code == 200 and revoked.json()["version"] == 2, revoked.text
        again = with_tenant_limit(raised, "4322")
        refused = await new.put(url, content=again, headers={"If-Match": made_from_lost})
        assert_problem(refused, 412, "unknown_version")
        served = yaml.safe_load((await new.get(url, headers=yaml_only)).text)
        assert served["agents"]["buyer-01"]["token_sha256"] == hash_token("revoked")
        listed = await new.get(f"{url}/history", params={"limit": 1})
        assert listed.json()[0]["version"] == 2
