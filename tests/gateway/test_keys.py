"""Managed keys end to end (issue 30, item 3), on two `irrev serve` hosts sharing one
Redis: a key created through one host opens the tenant's agent on both; a rotation
makes the old token refused (401) and the new one admitted on both; a key with a
short lifetime is refused once it ends, by Redis's clock; a revocation is refused on
both within one refresh (measured, printed); an agent removed from the policy is no
longer opened by its key. A tenant admin manages only its own tenant's keys, and
never a key that grants more than its role; bad input gets problem+json.

Every wait polls a condition with a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from irrev.harness import PolicyDraft, new_token
from pricing.credentials import hash_token

from .helpers import assert_problem, based
from .servers import BIN, EXAMPLES, Server, base_env

REFRESH_S = 0.5
FLUSH_S = 0.5
WAIT_S = 30.0
# Revocation reaches the other host at its next refresh look after the announcement:
# one refresh interval (measured 0.43 s), plus what a loaded 2-core CI machine may add
# to its timer and round trips.
REVOKED_WITHIN_S = REFRESH_S + 2.0
CATALOG = "/tools/supplier/catalog"


@dataclass
class Keys:
    policy_dir: Path
    hosts: list[Server]
    tenant: str
    other: str
    operator: str
    approver: str
    viewer: str
    policy_admin: str
    other_admin: str

    def path(self, tenant: str | None = None, tail: str = "") -> str:
        return f"/v1/admin/tenants/{tenant or self.tenant}/keys{tail}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def policy(tenant: str, supplier: str, admins: dict[str, tuple[str, str]]) -> PolicyDraft:
    """procurement as `tenant`, with an agent `keyed` that only managed keys open (no
    token_sha256), and `admins` (id -> (token, role))."""
    written = PolicyDraft.read(EXAMPLES / "procurement.yaml").named(tenant).fresh_tokens()
    written.point(f"{supplier}/{tenant}").fresh_settlers()
    written.document["agents"]["keyed"] = {
        "principal": "procurement",
        "per_effect_cap": "100",
        "window_cap": "1000",
    }
    written.document["admins"] = {
        name: {"token_sha256": hash_token(token), "role": role}
        for name, (token, role) in admins.items()
    }
    return written


@pytest.fixture(scope="module")
def keys_fleet(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Keys]:
    root = tmp_path_factory.mktemp("keys")
    run = secrets.token_hex(4)
    fleet = Keys(
        root / "policies",
        [],
        f"keys-{run}",
        f"keys-other-{run}",
        *(new_token() for _ in range(5)),
    )
    policy(
        fleet.tenant,
        suppliers.url,
        {
            "ann": (fleet.approver, "approver"),
            "vic": (fleet.viewer, "viewer"),
            "pat": (fleet.policy_admin, "policy_admin"),
        },
    ).write(fleet.policy_dir)
    others = {"olga": (fleet.other_admin, "policy_admin")}
    policy(fleet.other, suppliers.url, others).write(fleet.policy_dir)
    env = base_env(
        IRREV_REDIS_URL=redis_url,
        IRREV_POLICY_DIR=str(fleet.policy_dir),
        IRREV_ADMIN_TOKENS=f"ops={fleet.operator}",
        IRREV_POLICY_CHECK_INTERVAL_S=str(REFRESH_S),
        IRREV_KEYS_USED_FLUSH_S=str(FLUSH_S),
        IRREV_SWEEP_INTERVAL_S="1",
    )
    for i in range(2):
        server = Server(name=f"gateway {i}", argv=[], env=env, log_path=root / f"gateway{i}.log")
        server.argv = [str(BIN / "irrev"), "serve", "--port", str(server.port), "--workers", "1"]
        fleet.hosts.append(server)
    try:
        for server in fleet.hosts:
            server.start("/readyz")
        yield fleet
    finally:
        for server in fleet.hosts:
            server.stop()


@pytest.fixture
async def clients(keys_fleet: Keys) -> AsyncIterator[list[httpx.AsyncClient]]:
    opened = [
        httpx.AsyncClient(base_url=server.url, timeout=30.0, trust_env=False)
        for server in keys_fleet.hosts
    ]
    try:
        yield opened
    finally:
        for client in opened:
            await client.aclose()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until `condition` held, polled."""
    start = time.monotonic()
    while not await condition():
        assert time.monotonic() - start < WAIT_S, f"never: {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def status_on_all(
    clients: list[httpx.AsyncClient], token: str, status: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        answers = [await client.get(CATALOG, headers=bearer(token)) for client in clients]
        return all(answer.status_code == status for answer in answers)

    return check


async def create(
    client: httpx.AsyncClient, fleet: Keys, token: str, tenant: str | None = None, **body: Any
) -> httpx.Response:
    body.setdefault("owner", "test@example.com")
    return await client.post(fleet.path(tenant), json=body, headers=bearer(token))


async def test_a_key_lives_rotates_expires_and_is_revoked_on_both_hosts(
    keys_fleet: Keys, clients: list[httpx.AsyncClient]
) -> None:
    fleet = keys_fleet
    first, second = clients
    made = await create(first, fleet, fleet.operator, kind="agent", agent="keyed", purpose="run")
    assert made.status_code == 201, made.text
    key = made.json()
    token = key["token"]
    assert (key["kind"], key["agent"], key["state"], key["expires_at"]) == (
        "agent",
        "keyed",
        "live",
        None,
    )
    assert key["key_id"].startswith("key_") and len(key["key_id"]) == 16
    assert key["token_sha256_prefix"] == hash_token(token)[: len("sha256:") + 8]
    # The host that created it serves it at once; the other once told.
    assert (await first.get(CATALOG, headers=bearer(token))).status_code == 200
    await until(status_on_all(clients, token, 200), "the new key admitted on both hosts")

    listed = await second.get(fleet.path(), headers=bearer(fleet.operator))
    assert listed.status_code == 200, listed.text
    assert token not in listed.text and hash_token(token) not in listed.text
    (shown,) = [k for k in listed.json()["keys"] if k["key_id"] == key["key_id"]]
    assert "token" not in shown and shown["owner"] == "test@example.com"
    # When it was last used reaches the list within a flush, without a write per request.
    key_id = key["key_id"]

    async def used() -> bool:
        answer = await first.get(fleet.path(), headers=bearer(fleet.operator))
        return any(k["key_id"] == key_id and k["last_used_at"] for k in answer.json()["keys"])

    await until(used, "last_used recorded")

    rotated = await second.post(
        fleet.path(tail=f"/{key_id}/rotate"), headers=bearer(fleet.operator)
    )
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["token"]
    assert new != token and rotated.json()["rotated_at"]
    await until(status_on_all(clients, token, 401), "the old token refused on both hosts")
    await until(status_on_all(clients, new, 200), "the new token admitted on both hosts")

    short = await create(first, fleet, fleet.operator, kind="agent", agent="keyed", expires_in_s=2)
    assert short.status_code == 201, short.text
    brief = short.json()
    assert brief["expires_ms"] == brief["created_ms"] + 2000
    await until(status_on_all(clients, brief["token"], 200), "the short key admitted on both")
    expired_after = await until(
        status_on_all(clients, brief["token"], 401), "the short key refused once it expired"
    )
    print(f"\nthe 2 s key was refused on both hosts {expired_after:.2f} s after both admitted it")
    tail = f"/{brief['key_id']}/rotate"
    late = await first.post(fleet.path(tail=tail), headers=bearer(fleet.operator))
    assert_problem(late, 409, "key_expired")

    revoked = await first.post(fleet.path(tail=f"/{key_id}/revoke"), headers=bearer(fleet.operator))
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked", revoked.text
    start = time.monotonic()
    assert (await first.get(CATALOG, headers=bearer(new))).status_code == 401
    on_second = await until(status_on_all([second], new, 401), "revoked on the second host")
    print(f"revoked key refused by the second host {on_second * 1000:.0f} ms after the revoke")
    assert time.monotonic() - start < REVOKED_WITHIN_S
    again = await second.post(fleet.path(tail=f"/{key_id}/revoke"), headers=bearer(fleet.operator))
    assert again.json()["revoked_ms"] == revoked.json()["revoked_ms"]
    refused = await second.post(
        fleet.path(tail=f"/{key_id}/rotate"), headers=bearer(fleet.operator)
    )
    assert_problem(refused, 409, "key_revoked")


async def test_tenant_admins_manage_their_own_keys_within_their_role(
    keys_fleet: Keys, clients: list[httpx.AsyncClient]
) -> None:
    fleet = keys_fleet
    first, second = clients
    # An approver mints viewer and approver keys, never a policy_admin's nor an agent's.
    made = await create(first, fleet, fleet.approver, kind="admin", admin="vera", role="viewer")
    assert made.status_code == 201, made.text
    viewer_key = made.json()
    above = await create(first, fleet, fleet.approver, kind="admin", admin="x", role="policy_admin")
    assert_problem(above, 403, "insufficient_role")
    agent = await create(first, fleet, fleet.approver, kind="agent", agent="keyed")
    assert_problem(agent, 403, "insufficient_role")
    # A viewer lists keys and changes none.
    listed = await second.get(fleet.path(), headers=bearer(fleet.viewer))
    assert listed.status_code == 200, listed.text
    tail = f"/{viewer_key['key_id']}/revoke"
    assert_problem(
        await second.post(fleet.path(tail=tail), headers=bearer(fleet.viewer)),
        403,
        "insufficient_role",
    )
    # Another tenant's admin learns nothing of this tenant (as every admin endpoint).
    assert_problem(
        await first.get(fleet.path(), headers=bearer(fleet.other_admin)), 404, "unknown_tenant"
    )
    foreign = await create(first, fleet, fleet.other_admin, kind="admin", admin="o", role="viewer")
    assert_problem(foreign, 404, "unknown_tenant")
    assert_problem(
        await first.post(fleet.path(tail=tail), headers=bearer(fleet.other_admin)),
        404,
        "unknown_tenant",
    )
    # ...and manages its own.
    own = await create(first, fleet, fleet.other_admin, fleet.other, kind="agent", agent="keyed")
    assert own.status_code == 201, own.text

    # A managed admin key is an admin of its tenant, with its role, on both hosts.
    approver = await create(
        first, fleet, fleet.policy_admin, kind="admin", admin="al", role="approver"
    )
    assert approver.status_code == 201, approver.text
    managed = approver.json()["token"]

    async def lists_on_both() -> bool:
        answers = [await c.get(fleet.path(), headers=bearer(managed)) for c in clients]
        return all(answer.status_code == 200 for answer in answers)

    await until(lists_on_both, "the managed approver key lists keys on both hosts")
    assert_problem(
        await second.get(fleet.path(fleet.other), headers=bearer(managed)), 404, "unknown_tenant"
    )
    above = await create(second, fleet, managed, kind="admin", admin="y", role="policy_admin")
    assert_problem(above, 403, "insufficient_role")
    revoked = await second.post(fleet.path(tail=tail), headers=bearer(managed))
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked", revoked.text
    # A policy admin gives agents keys.
    agent = await create(second, fleet, fleet.policy_admin, kind="agent", agent="buyer-01")
    assert agent.status_code == 201, agent.text


async def test_an_admin_key_takes_a_policy_admins_name_only_for_that_admin(
    keys_fleet: Keys, clients: list[httpx.AsyncClient]
) -> None:
    """Decisions are recorded under a key's admin name: an approver's key named after
    the policy's policy_admin `pat` would approve as pat. Only pat may take it."""
    fleet = keys_fleet
    first, _ = clients
    for asker in (fleet.approver, fleet.operator):
        forged = await create(first, fleet, asker, kind="admin", admin="pat", role="approver")
        assert_problem(forged, 409, "admin_name_in_policy")
        assert forged.json()["admin"] == "pat"
    listed = await first.get(fleet.path(), headers=bearer(fleet.operator))
    assert "pat" not in {key.get("admin") for key in listed.json()["keys"]}
    own = await create(first, fleet, fleet.policy_admin, kind="admin", admin="pat", role="viewer")
    assert own.status_code == 201, own.text
    # A name the policy does not hold is anyone's with the role to grant it.
    other = await create(first, fleet, fleet.approver, kind="admin", admin="ann2", role="viewer")
    assert other.status_code == 201, other.text


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"kind": "agent"}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "role": "viewer"}, 422, "bad_request"),
        ({"kind": "admin", "admin": "a"}, 422, "bad_request"),
        ({"kind": "admin", "admin": "a", "role": "root"}, 422, "bad_request"),
        ({"kind": "robot", "agent": "keyed"}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "expires_in_s": 0}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "owner": ""}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "purpose": "a\nb"}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "owner": "ann\u202egpj.exe"}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "purpose": "ci\u200b"}, 422, "bad_request"),
        ({"kind": "agent", "agent": "keyed", "extra": 1}, 422, "bad_request"),
        ({"kind": "agent", "agent": "nobody"}, 404, "unknown_agent"),
    ],
    ids=[
        "no-agent",
        "agent-with-role",
        "admin-without-role",
        "unknown-role",
        "unknown-kind",
        "zero-lifetime",
        "no-owner",
        "control-character",
        "bidi-override",
        "zero-width",
        "unknown-field",
        "unknown-agent",
    ],
)
async def test_bad_input_is_refused_with_problem_json(
    keys_fleet: Keys,
    clients: list[httpx.AsyncClient],
    body: dict[str, Any],
    status: int,
    reason: str,
) -> None:
    body = {"owner": "o", **body}
    answer = await clients[0].post(
        keys_fleet.path(), json=body, headers=bearer(keys_fleet.operator)
    )
    assert_problem(answer, status, reason)


async def test_unknown_keys_and_callers_are_refused(
    keys_fleet: Keys, clients: list[httpx.AsyncClient]
) -> None:
    fleet = keys_fleet
    client = clients[1]
    for tail in ("/key_000000000000/rotate", "/key_000000000000/revoke", "/nonsense/revoke"):
        answer = await client.post(fleet.path(tail=tail), headers=bearer(fleet.operator))
        assert_problem(answer, 404, "key_not_found")
    assert_problem(await client.get(fleet.path()), 401, "unauthenticated")
    assert_problem(await client.get(fleet.path("nobody")), 401, "unauthenticated")
    assert_problem(
        await client.get(fleet.path("nobody"), headers=bearer(fleet.operator)),
        404,
        "unknown_tenant",
    )
    schema = (await client.get("/openapi.json")).json()
    assert {"post", "get"} <= set(schema["paths"]["/v1/admin/tenants/{tenant}/keys"])
    for verb in ("rotate", "revoke"):
        assert "post" in schema["paths"][f"/v1/admin/tenants/{{tenant}}/keys/{{key_id}}/{verb}"]


async def test_a_key_of_an_agent_removed_from_the_policy_is_refused(
    keys_fleet: Keys, clients: list[httpx.AsyncClient]
) -> None:
    fleet = keys_fleet
    made = await create(
        clients[0], fleet, fleet.other_admin, fleet.other, kind="agent", agent="keyed"
    )
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    await until(status_on_all(clients, token, 200), "the key admitted on both hosts")
    document = yaml.safe_load((fleet.policy_dir / f"{fleet.other}.yaml").read_text())
    del document["agents"]["keyed"]
    uploaded = await clients[0].put(
        f"/v1/admin/tenants/{fleet.other}/policy",
        content=yaml.safe_dump(document, sort_keys=False),
        headers={
            **await based(clients[0], fleet.other, bearer(fleet.operator)),
            "Content-Type": "application/yaml",
        },
    )
    assert uploaded.status_code == 200, uploaded.text
    await until(status_on_all(clients, token, 401), "the key refused once its agent is gone")


def irrev_keys(fleet: Keys, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = base_env(IRREV_REDIS_URL=redis_url)
    command = [str(BIN / "irrev"), "keys", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
async def test_the_cli_manages_keys_the_gateways_serve(
    keys_fleet: Keys, clients: list[httpx.AsyncClient], redis_url: str
) -> None:
    """`irrev keys` on the gateways' Redis: what it creates both hosts admit, what it
    revokes both refuse; bad input is one line on stderr and a non-zero exit."""
    fleet = keys_fleet
    tenant = ["--tenant", fleet.tenant]
    made = irrev_keys(
        fleet, redis_url, "create", *tenant, "--agent", "keyed", "--owner", "cli", "--json"
    )
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)
    await until(status_on_all(clients, key["token"], 200), "the CLI's key admitted on both")
    listed = irrev_keys(fleet, redis_url, "list", *tenant, "--json")
    assert listed.returncode == 0, listed.stderr
    assert key["token"] not in listed.stdout
    assert key["key_id"] in {k["key_id"] for k in json.loads(listed.stdout)["keys"]}
    rotated = irrev_keys(fleet, redis_url, "rotate", *tenant, key["key_id"])
    assert rotated.returncode == 0, rotated.stderr
    (new,) = [line.rpartition(" ")[2] for line in rotated.stdout.splitlines() if "token" in line]
    await until(status_on_all(clients, key["token"], 401), "the rotated-away token refused")
    revoked = irrev_keys(fleet, redis_url, "revoke", *tenant, key["key_id"])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked.stderr
    await until(status_on_all(clients, new, 401), "the CLI's revocation refused on both")

    for args, said in (
        (["create", *tenant, "--agent", "nobody", "--owner", "o"], "has no agent 'nobody'"),
        (["create", *tenant, "--admin", "a", "--owner", "o"], "needs --role"),
        (["create", "--tenant", "nobody", "--agent", "keyed", "--owner", "o"], "no policy"),
        (["rotate", *tenant, key["key_id"]], "is revoked"),
        (["revoke", *tenant, "key_000000000000"], "has no key"),
        (["revoke", *tenant, "nonsense"], "key_id"),
    ):
        refused = irrev_keys(fleet, redis_url, *args)
        assert refused.returncode != 0, (args, refused.stdout)
        lines = [
            line for line in refused.stderr.splitlines() if not line.startswith("irrev: ledger at")
        ]
        assert len(lines) == 1 and said in lines[0], (args, refused.stderr)
