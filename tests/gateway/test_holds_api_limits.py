"""A refusal's answer is bounded whatever the request: one error per extra key, all
of them echoed back, made one agent's 840 KB of extra keys draw a 4 MB answer."""

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
