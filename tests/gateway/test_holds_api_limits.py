"""The decision API's bodies cost what the tenant's request_limits allow, as the
proxy's and /mcp's do: they are read once the agent is known, within its tenant's
bounds, and a refusal's answer is bounded whatever the request. Before, FastAPI
parsed a body of up to IRREV_MAX_BODY_BYTES and pydantic built one error per extra
key, all of them echoed back: one agent's 840 KB of extra keys took a worker about
half a second and drew a 4 MB answer, and its tenant's other agents waited."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.edge.problems import MAX_LISTED_ERRORS

from .conftest import TenantMaker
from .helpers import assert_problem, effect_headers
from .servers import Tenant

DEPLOY = {"tool": "deploy", "method": "POST", "path": "/deploys"}
# Every refusal below is a few hundred bytes; this is far below what an answer listing
# what it got could be, and far above what a refusal needs.
ANSWER_BOUND = 8192


@pytest.fixture(scope="module")
def bounded(new_tenant: TenantMaker) -> Tenant:
    return new_tenant("holds-limits", request_limits={"max_values": 1000, "max_body_bytes": 8192})


def extra_keys(fields: dict[str, object], n: int, width: int = 6) -> dict[str, object]:
    return {**fields, **{f"k{i:0{width}d}": 1 for i in range(n)}}


@pytest.mark.parametrize(
    ("target", "fields"),
    [
        ("/v1/holds", DEPLOY),
        ("/v1/holds/h-x/post", {}),
        ("/v1/holds/h-x/ambiguous", {}),
        ("/v1/holds/h-x/compensate", {"recovered_micros": 0}),
        # The proxy, for comparison: the same body, the same refusal.
        ("/tools/supplier/orders", {}),
    ],
)
async def test_many_extra_keys_are_refused_within_the_tenants_limits(
    bounded: Tenant, http: httpx.AsyncClient, target: str, fields: dict[str, object]
) -> None:
    """3,000 keys are 6,000 values, past the tenant's 1,000, in 48 KB: within the
    gateway's bound (64 KiB) but not the tenant's (8 KiB)."""
    body = json.dumps(extra_keys(fields, 3000)).encode()
    headers = {**effect_headers(bounded, "deployer-01", "many"), "Content-Type": "application/json"}
    response = await http.post(target, content=body, headers=headers)
    assert_problem(response, 413, "body_too_large")
    assert len(response.content) < ANSWER_BOUND
    small = json.dumps(extra_keys(fields, 600, width=1)).encode()
    assert len(small) < 8192
    response = await http.post(target, content=small, headers=headers)
    assert_problem(response, 413, "body_too_complex")
    assert len(response.content) < ANSWER_BOUND


async def test_the_validation_answer_lists_a_bounded_number_of_errors(
    bounded: Tenant, http: httpx.AsyncClient
) -> None:
    """60 extra keys: the answer names the first MAX_LISTED_ERRORS fields and counts the
    rest; a key of 6,000 characters is named cut short."""
    long_keys = {f"{i:02d}" + "k" * 100: 1 for i in range(60)}
    body = json.dumps({**DEPLOY, **long_keys}).encode()
    headers = {
        **effect_headers(bounded, "deployer-01", "listed"),
        "Content-Type": "application/json",
    }
    response = await http.post("/v1/holds", content=body, headers=headers)
    problem = assert_problem(response, 422, "bad_request")
    assert len(problem["errors"]) == MAX_LISTED_ERRORS
    assert problem["errors_omitted"] == 60 - MAX_LISTED_ERRORS
    assert problem["errors"][0]["field"].startswith("body.00k")
    assert len(response.content) < ANSWER_BOUND
    body = json.dumps({**DEPLOY, "k" * 6000: 1}).encode()
    response = await http.post("/v1/holds", content=body, headers=headers)
    [error] = assert_problem(response, 422, "bad_request")["errors"]
    assert error["field"].startswith("body.kkk") and len(error["field"]) < 200


async def test_a_few_errors_are_all_listed(bounded: Tenant, http: httpx.AsyncClient) -> None:
    headers = {**effect_headers(bounded, "deployer-01", "few"), "Content-Type": "application/json"}
    response = await http.post(
        "/v1/holds/h-x/post", json={"amount_micros": "5", "price": 0}, headers=headers
    )
    problem = assert_problem(response, 422, "bad_request")
    assert sorted(e["field"] for e in problem["errors"]) == ["body.amount_micros", "body.price"]
    assert "errors_omitted" not in problem
