"""docs/design.md, "Policy changes": the fleet's policy store is the truth and a host's files one way in.
Every change names the version it was made from and writes only what it changed,
over the store's newest version; a stale copy changes nothing by being there, being
touched or being served to a restarted host. In-process TenantStores on their own
directories stand for hosts with their own copies (each file is its own source);
the admin API is tested on the shared gateway."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.state.policies import policy_version
from gateway.state.policy_changes import StoreVersion, VersionForgotten
from gateway.state.tenants import TenantStore
from ledger import POLICY_HISTORY, AccountSpec, EmbeddedRedis, Ledger, PolicyRecord
from ledger.keys import policy_key, policy_log_key, policy_sources_key
from pricing.credentials import hash_token

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem
from .servers import Tenant, write_policy


@pytest.fixture(scope="module")
def policy_changes_tenant(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("policy-changes")


UPSTREAM = "http://127.0.0.1:9"


@pytest.fixture
async def ledger(redis_url: str) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(redis_url)
    yield ledger
    await ledger.aclose()


def as_stored(record: PolicyRecord) -> StoreVersion:
    """The version `record` is, as its ETag names it: a change made from it names it so."""
    return StoreVersion(record.version, record.digest)


def edit(path: Path, change: Any) -> None:
    document = yaml.safe_load(path.read_text())
    change(document)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(yaml.safe_dump(document, sort_keys=False))
    temporary.replace(path)


async def tenant_limit(ledger: Ledger, tenant: str) -> int:
    return {b.account: b.limit for b in await ledger.balances(tenant)}[f"tenant:{tenant}"]


async def hosts(ledger: Ledger, tmp_path: Path, tenant: str, n: int) -> list[TenantStore]:
    """`n` hosts, each with its own copy of one policy, the first one's loaded first
    (it goes into the store); each copy's tenant limit differs (1000, 1001, ...)."""
    first = write_policy(tmp_path / "h0", "procurement", tenant, UPSTREAM)
    stores = []
    for i in range(n):
        directory = tmp_path / f"h{i}"
        if i:
            directory.mkdir()
            text = (tmp_path / "h0" / f"{tenant}.yaml").read_text()
            (directory / f"{tenant}.yaml").write_text(text)
        edit(
            directory / f"{tenant}.yaml",
            lambda d, i=i: d["accounts"]["tenant"].update(limit=str(1000 + i)),
        )
        store = TenantStore(directory)
        await store.load(ledger)
        stores.append(store)
    assert first.tokens
    return stores


async def test_a_copy_seen_first_is_recorded_not_applied_nor_by_being_touched(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    a, b = await hosts(ledger, tmp_path, tenant, 2)
    assert await tenant_limit(ledger, tenant) == 1000 * 10**6
    served = b.served(tenant)
    assert served is not None and served.version == 1
    copy = tmp_path / "h1" / f"{tenant}.yaml"
    later = time.time() + 60
    os.utime(copy, (later, later))  # newer by its time, not by its content
    copy.chmod(0o640)
    await b.apply(ledger)
    restarted = TenantStore(tmp_path / "h1")
    await restarted.load(ledger)
    [record] = (await ledger.policies.records([tenant])).values()
    assert record.version == 1
    assert await tenant_limit(ledger, tenant) == 1000 * 10**6
    assert (
        restarted.policies[tenant].document.accounts.tenant.limit
        == a.policies[tenant].document.accounts.tenant.limit
    )


async def test_an_edit_of_a_stale_copy_writes_only_what_it_changed(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    a, b, c = await hosts(ledger, tmp_path, tenant, 3)
    edit(tmp_path / "h2" / f"{tenant}.yaml", lambda d: d["accounts"]["tenant"].update(limit="1888"))
    await c.apply(ledger)
    edit(tmp_path / "h0" / f"{tenant}.yaml", lambda d: d["accounts"]["tenant"].update(limit="1777"))
    await a.apply(ledger)
    token = hash_token("revoked")
    edit(
        tmp_path / "h1" / f"{tenant}.yaml",
        lambda d: d["agents"]["buyer-01"].update(token_sha256=token),
    )
    await b.apply(ledger)
    for store in (a, b, c):
        await store.apply(ledger)
        served = store.policies[tenant].document
        assert served.accounts.tenant.limit == b.policies[tenant].document.accounts.tenant.limit
        assert served.agents["buyer-01"].token_sha256 == token
    assert await tenant_limit(ledger, tenant) == 1777 * 10**6
    history = await ledger.policies.history(tenant)
    assert [r.version for r in history] == [4, 3, 2, 1]
    assert all(r.origin.startswith("file ") for r in history)


async def test_an_edit_made_while_the_host_was_down_is_taken_in_at_start(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    a, b = await hosts(ledger, tmp_path, tenant, 2)
    await b.aclose()
    edit(tmp_path / "h1" / f"{tenant}.yaml", lambda d: d["accounts"]["tenant"].update(limit="5"))
    restarted = TenantStore(tmp_path / "h1")
    await restarted.load(ledger)
    assert await tenant_limit(ledger, tenant) == 5 * 10**6
    await a.apply(ledger)
    assert str(a.policies[tenant].document.accounts.tenant.limit) == str(
        restarted.policies[tenant].document.accounts.tenant.limit
    )


async def test_an_edit_that_does_not_load_over_the_newer_version_is_its_files_fault(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """B edits the routes of an agent A removed meanwhile: merged, that agent has
    routes and no token, which does not load. Nothing is written; B's file is
    reported; B serves the store's version."""
    a, b = await hosts(ledger, tmp_path, tenant, 2)
    edit(tmp_path / "h0" / f"{tenant}.yaml", lambda d: d["agents"].pop("buyer-01"))
    await a.apply(ledger)
    edit(
        tmp_path / "h1" / f"{tenant}.yaml",
        lambda d: d["agents"]["buyer-01"].update(routes=["supplier GET /catalog"]),
    )
    report = await b.apply(ledger)
    [fault] = report.faults
    assert "does not load" in str(fault.error) and fault.tenant == tenant
    [record] = (await ledger.policies.records([tenant])).values()
    assert record.version == 2
    assert "buyer-01" not in b.policies[tenant].document.agents


async def test_hosts_of_one_host_name_and_path_are_told_apart_by_their_instance(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """Two containers built from one image: the same host name, the policy at the same
    path, each its own copy. Keyed by host name, B's stale copy read as an edit of
    A's file, from what A last read, and put A's old limit back. Each gateway is its
    own source (IRREV_INSTANCE, which `irrev serve` sets per address and port): B's
    copy is seen for the first time, recorded, not applied."""
    write_policy(tmp_path, "procurement", tenant, UPSTREAM)
    path = tmp_path / f"{tenant}.yaml"
    stale = path.read_text()
    a = TenantStore(tmp_path, instance="gateway:10.0.0.1:8080")
    await a.load(ledger)
    edit(path, lambda d: d["accounts"]["tenant"].update(limit="1234"))
    await a.apply(ledger)
    assert await tenant_limit(ledger, tenant) == 1234 * 10**6
    await a.aclose()
    path.write_text(stale)  # B's own copy, at the same path on its own disk
    b = TenantStore(tmp_path, instance="gateway:10.0.0.2:8080")
    await b.load(ledger)
    [record] = (await ledger.policies.records([tenant])).values()
    assert record.version == 2
    assert await tenant_limit(ledger, tenant) == 1234 * 10**6
    assert (
        str(b.policies[tenant].document.accounts.tenant.limit)
        != yaml.safe_load(stale)["accounts"]["tenant"]["limit"]
    )


async def test_older_limits_never_overwrite_newer_ones(ledger: Ledger, tenant: str) -> None:
    """Two hosts write two versions' limits in the wrong order: the newer stay."""
    account = f"tenant:{tenant}"
    assert (
        await ledger.upsert_account(
            tenant, AccountSpec(account=account, limit=300, soft_limit=300), 3
        )
        == "created"
    )
    assert (
        await ledger.upsert_account(
            tenant, AccountSpec(account=account, limit=200, soft_limit=200), 2
        )
        == "kept"
    )
    assert await tenant_limit(ledger, tenant) == 300
    assert (
        await ledger.upsert_account(
            tenant, AccountSpec(account=account, limit=400, soft_limit=400), 4
        )
        == "updated"
    )
    assert await ledger.policy_versions({tenant: [account, "tenant:none"]}) == {
        tenant: {account: 4}
    }


async def test_an_upload_from_a_forgotten_version_is_refused(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    [store] = await hosts(ledger, tmp_path, tenant, 1)
    text = (tmp_path / "h0" / f"{tenant}.yaml").read_text()
    digest = policy_version(text)
    for version in range(1, POLICY_HISTORY + 1):
        changed = text.replace("limit: '1000'", f"limit: '{2000 + version}'")
        put = await ledger.policies.put(
            tenant,
            expected=version,
            expected_digest=digest,
            digest=policy_version(changed),
            text=changed,
            origin="t",
        )
        assert put.won
        digest = put.digest
    with pytest.raises(VersionForgotten) as refused:
        await store.upload(ledger, tenant, text, StoreVersion(1, policy_version(text)), "test")
    assert refused.value.current == StoreVersion(POLICY_HISTORY + 1, digest)


# -- the admin API ---------------------------------------------------------------


async def served_yaml(http: httpx.AsyncClient, gateway: Gateway, tenant: str) -> httpx.Response:
    response = await http.get(
        f"/v1/admin/tenants/{tenant}/policy",
        headers={**gateway.admin, "Accept": "application/yaml"},
    )
    assert response.status_code == 200, response.text
    return response


async def test_an_upload_names_the_version_it_was_made_from(
    policy_changes_tenant: Tenant, gateway: Gateway, http: httpx.AsyncClient
) -> None:
    tenant = policy_changes_tenant.id
    url = f"/v1/admin/tenants/{tenant}/policy"
    shown = await served_yaml(http, gateway, tenant)
    etag = shown.headers["etag"]
    version = int(etag.strip('"').partition("-")[0])
    assert etag == f'"{version}-{policy_version(shown.text)}"'
    base = yaml.safe_load(shown.text)

    async def put(document: dict[str, Any], if_match: str | None) -> httpx.Response:
        headers = dict(gateway.admin)
        if if_match is not None:
            headers["If-Match"] = if_match
        return await http.put(url, content=yaml.safe_dump(document), headers=headers)

    body = assert_problem(await put(base, None), 428, "base_required")
    assert body["current_version"] == version
    for bad in ('"seven"', '"1", "2"', '"-1"', f'"{version}-"', f'"{version}-XYZ"'):
        assert_problem(await put(base, bad), 400, "bad_if_match")
    # Its number alone, as ETags were: another version may have it after a failover.
    bare = assert_problem(await put(base, f'"{version}"'), 412, "if_match_without_digest")
    assert "GET the policy" in bare["detail"]
    digest = policy_version(shown.text)
    assert_problem(await put(base, f'"{version + 5}-{digest}"'), 412, "unknown_version")
    assert_problem(await put(base, f'"{version}-{"0" * 12}"'), 412, "unknown_version")

    first = yaml.safe_load(shown.text)
    first["accounts"]["principals"]["platform"]["limit"] = "12345"
    applied = await put(first, etag)
    assert applied.status_code == 200 and applied.json()["version"] == version + 1, applied.text
    # Made from the same (now older) version, changing another field: merged.
    second = yaml.safe_load(shown.text)
    second["agents"]["buyer-02"]["token_sha256"] = hash_token("new")
    merged = await put(second, etag)
    assert merged.status_code == 200 and merged.json()["version"] == version + 2, merged.text
    now = yaml.safe_load((await served_yaml(http, gateway, tenant)).text)
    assert now["accounts"]["principals"]["platform"]["limit"] == "12345"
    assert now["agents"]["buyer-02"]["token_sha256"] == hash_token("new")
    # Made from it, changing the field the first upload changed: refused, nothing applied.
    third = yaml.safe_load(shown.text)
    third["accounts"]["principals"]["platform"]["limit"] = "99"
    conflict = await put(third, etag)
    refused = assert_problem(conflict, 409, "policy_conflict")
    assert refused["fields"] == ["accounts.principals.platform.limit"]
    assert refused["current_version"] == version + 2
    now_shown = await served_yaml(http, gateway, tenant)
    assert conflict.headers["etag"] == now_shown.headers["etag"]
    history = await http.get(f"{url}/history", headers=gateway.admin, params={"limit": 3})
    assert [h["version"] for h in history.json()] == [version + 2, version + 1, version]
    assert history.json()[0]["origin"] == "upload operator:ops"


def with_tenant_limit(text: str, limit: str) -> str:
    document = yaml.safe_load(text)
    document["accounts"]["tenant"]["limit"] = limit
    return yaml.safe_dump(document, sort_keys=False)


async def test_a_host_that_missed_a_version_serves_the_next_under_its_own_number(
    ledger: Ledger, tmp_path: Path, tenant: str
) -> None:
    """The store goes v1 -> v2 (a raise, whose limits its uploader wrote) -> v3 (v1's
    text again, written by a host that died before it wrote the limits). A host that
    served v1 and never looked at v2 serves v3 as v3, not as the v1 it already held,
    so it writes v3's limits over v2's raise (a lower number is kept out by them)."""
    a, b = await hosts(ledger, tmp_path, tenant, 2)
    v1 = (await ledger.policies.records([tenant]))[tenant]
    served = b.served(tenant)
    assert served is not None and served.version == 1
    raised = await a.upload(
        ledger, tenant, with_tenant_limit(v1.text, "999999"), as_stored(v1), "raise"
    )
    assert await tenant_limit(ledger, tenant) == 999999 * 10**6
    put = await ledger.policies.put(
        tenant,
        expected=2,
        expected_digest=raised.version.digest,
        digest=policy_version(v1.text),
        text=v1.text,
        origin="revert",
    )
    assert put.won and put.version == 3
    await b.apply(ledger)
    served = b.served(tenant)
    assert served is not None and served.version == 3
    assert await tenant_limit(ledger, tenant) == 1000 * 10**6


async def test_a_restarted_host_that_cannot_use_the_stores_version_serves_no_copy_of_its_own(
    ledger: Ledger, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's version revokes an agent and takes a tool's credential from an
    environment variable a restarted host lacks. That host cannot serve the store's
    version, and its own copy is older: served, it would let the revoked token in
    again. The tenant is not served there (a fault says why) until it can be."""
    made = write_policy(tmp_path / "a", "procurement", tenant, UPSTREAM)
    token = made.tokens["buyer-01"]
    stale = (tmp_path / "a" / f"{tenant}.yaml").read_text()
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / f"{tenant}.yaml").write_text(stale)
    a = TenantStore(tmp_path / "a", instance="host-a")
    await a.load(ledger)
    monkeypatch.setenv("SUPPLIER_TEST_KEY", "s3cret")
    document = yaml.safe_load(stale)
    document["agents"]["buyer-01"]["token_sha256"] = hash_token("revoked")
    tool = next(iter(document["tools"]))
    document["tools"][tool]["credentials"] = {"X-Key": {"env": "SUPPLIER_TEST_KEY"}}
    base = StoreVersion(1, policy_version(stale))
    await a.upload(ledger, tenant, yaml.safe_dump(document, sort_keys=False), base, "operator")
    assert a.authenticate(token) is None
    monkeypatch.delenv("SUPPLIER_TEST_KEY")
    restarted = TenantStore(tmp_path / "h", instance="host-h")
    report = await restarted.apply(ledger)
    assert restarted.authenticate(token) is None
    assert restarted.served(tenant) is None
    assert [fault.tenant for fault in report.faults] == [tenant]
    assert "SUPPLIER_TEST_KEY" in str(report.faults[0].error)
    monkeypatch.setenv("SUPPLIER_TEST_KEY", "s3cret")
    await restarted.apply(ledger)
    served = restarted.served(tenant)
    assert served is not None and served.version == 2
    assert restarted.authenticate(token) is None


@pytest.mark.parametrize("lost", ["the policy store", "everything", "everything, retaken"])
async def test_a_store_that_starts_again_writes_limits_the_accounts_let_in(
    tmp_path: Path, tenant: str, lost: str
) -> None:
    """The store's versions reach 3 and the accounts hold version 3's limits; then the
    policy store's keys are lost (the accounts stay), or all of Redis is flushed and
    the host serving version 3 opens its accounts again (a reserve met them missing)
    before it reloads, with or without a restarted host having put its file into the
    store first. Versions that started again at 1 were older than what the accounts
    held, and each later version's limits were kept out (account.lua): a raise
    uploaded then was answered applied and never enforced."""
    with EmbeddedRedis(tmp_path / "redis", tcp=True) as server:
        ledger = Ledger.from_url(server.url)
        try:
            [store] = await hosts(ledger, tmp_path, tenant, 1)
            for limit in ("2000", "3000"):
                record = (await ledger.policies.records([tenant]))[tenant]
                raised = with_tenant_limit(record.text, limit)
                await store.upload(ledger, tenant, raised, as_stored(record), "raise")
            assert await tenant_limit(ledger, tenant) == 3000 * 10**6
            if lost.startswith("everything"):
                await ledger.redis.flushall()
                if lost.endswith("retaken"):
                    await TenantStore(tmp_path / "h0").load(ledger)
                await store.open_missing(ledger, tenant)
            else:
                await ledger.redis.delete(
                    policy_key(tenant), policy_log_key(tenant), policy_sources_key(tenant)
                )
            await store.apply(ledger)  # the file goes into the store again
            record = (await ledger.policies.records([tenant]))[tenant]
            assert await tenant_limit(ledger, tenant) == 1000 * 10**6  # the file's
            raise_ = with_tenant_limit(record.text, "7777")
            await store.upload(ledger, tenant, raise_, as_stored(record), "raise")
            assert await tenant_limit(ledger, tenant) == 7777 * 10**6
        finally:
            await ledger.aclose()
