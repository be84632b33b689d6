"""One agent cannot fill its tenant's Redis with the answers kept for its repeats.

A review filled a 40 MB Redis headroom with 576 cheap orders whose tool answered
64 KB each (4.39 USD spent), and then every agent of the tenant got 503
`ledger_unavailable`. Each agent now has an allowance of kept answer bytes per UTC
day (`request_limits.kept_answer_bytes`); an answer past it is kept without its body
(status, headers, the body's length and SHA-256), so the effect is still never made
twice and a repeat says what it cannot show. Scaled down here: a 96 KiB allowance,
answers of 16 KiB. On `irrev serve --workers 2`, a real Redis and a scripted tool API."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from irrev.client import IrrevClient
from ledger import Ledger
from ledger.keys import hold_key, payload_key

from .conftest import Gateway, TenantMaker
from .helpers import effect_headers, order
from .procurement import tools_at
from .servers import Server, Tenant, script, seen, start_scripted

ALLOWANCE = 96 * 1024
ANSWER = 16 * 1024
ORDERS = 14  # 224 KiB of answers: more than twice the allowance


@pytest.fixture(scope="module")
def tool_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_scripted("kept-answers-tool", tmp_path_factory.mktemp("kept"), "127.0.0.1")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def kept_tenant(new_tenant: TenantMaker, tool_api: Server) -> Tenant:
    return new_tenant(
        "kept",
        tools=tools_at(tool_api.url),
        request_limits={"kept_answer_bytes": ALLOWANCE},
    )


@pytest.fixture
async def ledger(gateway: Gateway) -> AsyncIterator[Ledger]:
    ledger = Ledger.from_url(gateway.redis_url)
    yield ledger
    await ledger.aclose()


def answer(tag: str) -> str:
    """A JSON answer of ANSWER bytes, told apart by `tag`."""
    head = f'{{"order_id":"{tag}","pad":"'
    return head + "x" * (ANSWER - len(head) - 2) + '"}'


async def order_by(http: httpx.AsyncClient, tenant: Tenant, agent: str, key: str) -> str:
    """One cheap order (1 USD) under `key`; its hold id. The live answer is always whole."""
    response = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=1, unit_price="1"),
        headers=effect_headers(tenant, agent, key),
    )
    assert response.status_code == 200, response.text
    assert len(response.content) == ANSWER
    return response.headers["x-irrev-hold"]


async def kept_bodies(ledger: Ledger, tenant: Tenant, holds: list[str]) -> list[int]:
    """The body bytes each hold keeps for its repeats, read from the stored records."""
    sizes = []
    for hold_id in holds:
        hold = await ledger.hold(tenant.id, hold_id)
        assert hold is not None and hold.state.value == "posted", hold
        sizes.append(len(hold.outcome.partition("\n")[2].encode()))
    return sizes


async def memory_of(ledger: Ledger, tenant: Tenant, holds: list[str]) -> int:
    """What the holds' records and kept answers take in Redis (MEMORY USAGE)."""
    total = 0
    for hold_id in holds:
        for key in (hold_key(tenant.id, hold_id), payload_key(tenant.id, hold_id)):
            total += await ledger.redis.memory_usage(key) or 0
    return total


async def test_one_agent_keeps_at_most_its_allowance_and_the_others_keep_theirs(
    kept_tenant: Tenant, tool_api: Server, http: httpx.AsyncClient, ledger: Ledger
) -> None:
    tenant = kept_tenant
    await script(tool_api, 200, answer("flood"))
    flood = [await order_by(http, tenant, "buyer-01", f"flood-{i}") for i in range(ORDERS)]
    sizes = await kept_bodies(ledger, tenant, flood)
    memory = await memory_of(ledger, tenant, flood)
    print(
        f"buyer-01 kept {sum(sizes)} body bytes of {ORDERS * ANSWER} answered: {sizes}; "
        f"its {ORDERS} holds take {memory} bytes of Redis (MEMORY USAGE)"
    )
    assert sum(sizes) <= ALLOWANCE
    # The allocator rounds a 16.5 KB string up to its 20 KiB size class; a settled
    # hold's record takes a few hundred bytes more.
    assert memory <= ALLOWANCE * 5 // 4 + ORDERS * 1024
    # The allowance is used, not refused outright: the first answers are kept whole.
    assert sizes[: ALLOWANCE // (ANSWER + 1024)] == [ANSWER] * (ALLOWANCE // (ANSWER + 1024))
    assert sizes[-1] == 0

    await script(tool_api, 200, answer("other"))
    other = [await order_by(http, tenant, "buyer-02", f"other-{i}") for i in range(2)]
    assert await kept_bodies(ledger, tenant, other) == [ANSWER, ANSWER]


async def test_a_repeat_of_an_answer_kept_without_its_body_says_so_and_sends_nothing(
    kept_tenant: Tenant, tool_api: Server, http: httpx.AsyncClient, gateway: Gateway
) -> None:
    tenant, body = kept_tenant, answer("left-out")
    await script(tool_api, 200, body)
    for i in range(ALLOWANCE // ANSWER + 1):
        await order_by(http, tenant, "buyer-03", f"fill-{i}")
    sent = len(await seen(tool_api))
    await script(tool_api, 500, "a second effect would get this")
    again = await http.post(
        "/tools/supplier/orders",
        json=order(quantity=1, unit_price="1"),
        headers=effect_headers(tenant, "buyer-03", f"fill-{ALLOWANCE // ANSWER}"),
    )
    assert len(await seen(tool_api)) == sent, "the repeat was sent to the tool again"
    assert again.status_code == 200 and again.headers["x-irrev-replayed"] == "true"
    assert again.content == b""
    assert again.headers["x-irrev-body-omitted"] == str(ANSWER)
    assert again.headers["x-irrev-body-sha256"] == hashlib.sha256(body.encode()).hexdigest()
    assert again.headers["x-irrev-body-omitted-reason"] == "kept_answer_allowance"
    assert again.headers["content-type"] == "application/json"
    client = IrrevClient(gateway.url, tenant.tokens["buyer-03"])
    try:
        told = await client.call(
            "supplier",
            "POST",
            "/orders",
            f"fill-{ALLOWANCE // ANSWER}",
            json_body=order(quantity=1, unit_price="1"),
        )
    finally:
        await client.aclose()
    assert len(await seen(tool_api)) == sent
    assert told.ok and "it is not made again" in told.text, told.text
    assert "allowance of kept answers for today was used up" in told.text, told.text


async def test_answers_the_reconciler_learns_are_kept_within_the_allowance_too(
    kept_tenant: Tenant,
    tool_api: Server,
    http: httpx.AsyncClient,
    ledger: Ledger,
    gateway: Gateway,
) -> None:
    """An agent whose calls end ambiguous (the tool answers 503) has each posted by
    the reconciler with the lookup's answer: those answers are its kept bytes too, or
    an agent able to make its calls fail ambiguously keeps every one whole."""
    tenant = kept_tenant
    await script(tool_api, 503, "busy")
    holds = []
    for i in range(ORDERS):
        response = await http.post(
            "/tools/supplier/orders",
            json=order(quantity=1, unit_price="1"),
            headers=effect_headers(tenant, "buyer-04", f"unknown-{i}"),
        )
        assert response.status_code == 502, response.text
        holds.append(response.headers["x-irrev-hold"])
    await script(tool_api, 200, answer("looked-up"))
    response = await http.post(f"/v1/admin/tenants/{tenant.id}/reconcile", headers=gateway.admin)
    assert response.status_code == 200, response.text
    assert set(holds) <= set(response.json()["posted"]), response.json()
    sizes = await kept_bodies(ledger, tenant, holds)
    assert sum(sizes) <= ALLOWANCE, f"kept {sum(sizes)} body bytes: {sizes}"
