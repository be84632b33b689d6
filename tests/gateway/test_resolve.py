"""Resolving a hold by hand, on a real gateway: only a hold that was ambiguous can be
resolved, and of several people resolving one hold at once exactly one does; the
others are told who did. The same person's request said again answers as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from irrev.harness import new_token
from pricing.credentials import hash_token

from .conftest import Gateway, own_gateway
from .helpers import assert_problem, effect_headers, order, set_faults
from .servers import Server

RESOLVERS = ("ana", "ben", "cy")
TOKENS = {name: new_token() for name in RESOLVERS}


@pytest.fixture(scope="module")
def resolve_gateway(
    redis_url: str, suppliers: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root: Path = tmp_path_factory.mktemp("resolve")
    admins = {
        name: {"token_sha256": hash_token(token), "role": "approver"}
        for name, token in TOKENS.items()
    }
    with own_gateway(redis_url, suppliers, root, 2, {"admins": admins}) as gateway:
        yield gateway


@pytest.fixture
async def client(resolve_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=resolve_gateway.url, timeout=30, trust_env=False) as c:
        yield c


def as_admin(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


async def hold_of(
    client: httpx.AsyncClient, upstream: httpx.AsyncClient, gw: Gateway, key: str, status: int
) -> str:
    """A hold whose order the supplier answered with `status`."""
    tenant = gw.tenant("own")
    await set_faults(upstream, tenant, status=status) if status != 200 else None
    try:
        response = await client.post(
            "/tools/supplier/orders", json=order(), headers=effect_headers(tenant, "buyer-01", key)
        )
    finally:
        await set_faults(upstream, tenant)
    return response.headers["x-irrev-hold"]


async def resolve_events(client: httpx.AsyncClient, gw: Gateway, hold: str) -> list[Any]:
    tenant = gw.tenant("own")
    feed = await client.get(
        f"/v1/admin/tenants/{tenant.id}/events", params={"limit": 1000}, headers=gw.admin
    )
    return [
        e for e in feed.json()["events"] if e.get("hold") == hold and e["type"] == "hold.resolved"
    ]


@pytest.mark.parametrize(("status", "state"), [(200, "posted"), (422, "voided")])
async def test_a_hold_never_ambiguous_is_not_resolved(
    resolve_gateway: Gateway,
    client: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    status: int,
    state: str,
) -> None:
    """Before: 200 "resolved", a resolve journal entry and a hold.resolved event for an
    order the supplier took (or refused) plainly: a false audit record."""
    gw = resolve_gateway
    hold = await hold_of(client, upstream, gw, f"plain-{status}", status)
    url = f"/v1/admin/tenants/{gw.tenant('own').id}/holds/{hold}/resolve"
    answer = await client.post(url, json={"outcome": state, "reason": "checked"}, headers=gw.admin)
    body = assert_problem(answer, 409, "state_conflict")
    assert body["state"] == state
    view = await client.get(
        f"/v1/admin/tenants/{gw.tenant('own').id}/holds/{hold}", headers=gw.admin
    )
    assert view.json()["resolved_by"] is None
    assert await resolve_events(client, gw, hold) == []


async def test_of_concurrent_resolvers_one_wins_and_the_others_hear_who(
    resolve_gateway: Gateway, client: httpx.AsyncClient, upstream: httpx.AsyncClient
) -> None:
    """Before: all three got 200 "resolved by" themselves; the record named one."""
    gw = resolve_gateway
    hold = await hold_of(client, upstream, gw, "contested", 503)
    url = f"/v1/admin/tenants/{gw.tenant('own').id}/holds/{hold}/resolve"

    async def resolve(name: str) -> httpx.Response:
        reason = f"{name} checked with the supplier"
        return await client.post(
            url, json={"outcome": "posted", "reason": reason}, headers=as_admin(name)
        )

    answers = dict(zip(RESOLVERS, await asyncio.gather(*map(resolve, RESOLVERS)), strict=True))
    winners = [name for name, answer in answers.items() if answer.status_code == 200]
    assert len(winners) == 1, {n: a.text for n, a in answers.items()}
    [winner] = winners
    assert answers[winner].json()["by"] == winner
    for name, answer in answers.items():
        if name != winner:
            body = assert_problem(answer, 409, "state_conflict")
            assert body["by"] == winner and body["state"] == "posted"
    view = await client.get(
        f"/v1/admin/tenants/{gw.tenant('own').id}/holds/{hold}", headers=gw.admin
    )
    assert view.json()["resolved_by"] == winner
    [event] = await resolve_events(client, gw, hold)
    assert event["by"] == winner
    # The winner's request said again (a retry after a lost answer): the same answer,
    # no second record.
    again = await resolve(winner)
    assert again.status_code == 200 and again.json()["by"] == winner
    assert len(await resolve_events(client, gw, hold)) == 1
