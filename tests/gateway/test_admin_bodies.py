"""The admin routes that take a body (a key's creation, an ambiguous hold's
resolution, a rule) read it only once the caller may act: a caller without a token
is answered 401 and one whose role is too small 403, whatever it sent, never a 422
listing what is wrong with its body (which told a stranger the schema, and cost a
worker the parse). A caller who may act and sends a bad body gets the 422 it always
got, and the routes' bodies are still described in the OpenAPI document."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from irrev.harness import new_token
from pricing.credentials import hash_token

from .conftest import Gateway, TenantMaker
from .helpers import assert_problem
from .servers import Tenant

VIEWER, APPROVER = new_token(), new_token()
JSON = {"Content-Type": "application/json"}
# Not JSON at all, and JSON of the wrong shape (an unknown field, a wrong type).
MALFORMED = {"not-json": b"{not json", "wrong-shape": b'{"nonsense": [1, 2], "kind": 7}'}


@pytest.fixture(scope="module")
def bodies_tenant(new_tenant: TenantMaker) -> Tenant:
    admins = {
        "val": {"token_sha256": hash_token(VIEWER), "role": "viewer"},
        "amy": {"token_sha256": hash_token(APPROVER), "role": "approver"},
    }
    return new_tenant("admin-bodies", admins=admins)


def paths(tenant: Tenant) -> dict[str, str]:
    base = f"/v1/admin/tenants/{tenant.id}"
    return {
        "key": f"{base}/keys",
        "resolve": f"{base}/holds/no-such-hold/resolve",
        "rule": f"{base}/rules",
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("body", list(MALFORMED))
@pytest.mark.parametrize("route", ["key", "resolve", "rule"])
async def test_a_caller_who_may_not_act_learns_nothing_of_the_body(
    http: httpx.AsyncClient, bodies_tenant: Tenant, route: str, body: str
) -> None:
    path, raw = paths(bodies_tenant)[route], MALFORMED[body]
    stranger = await http.post(path, content=raw, headers=JSON)
    assert_problem(stranger, 401, "unauthenticated")
    viewer = await http.post(path, content=raw, headers=JSON | bearer(VIEWER))
    problem = assert_problem(viewer, 403, "insufficient_role")
    assert "errors" not in problem


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("key", {"kind": "robot", "owner": "o"}, "body.kind"),
        ("key", {"kind": "agent", "owner": "o"}, "body"),
        ("resolve", {"outcome": "maybe", "reason": "checked"}, "body.outcome"),
        ("rule", {"kind": "auto_approve", "reason": "r"}, "body.duration"),
    ],
)
async def test_a_caller_who_may_act_gets_the_schema_refusal(
    http: httpx.AsyncClient,
    gateway: Gateway,
    bodies_tenant: Tenant,
    route: str,
    body: dict[str, Any],
    field: str,
) -> None:
    path = paths(bodies_tenant)[route]
    for headers in (gateway.admin, bearer(APPROVER)):
        refused = await http.post(path, json=body, headers=headers)
        problem = assert_problem(refused, 422, "bad_request")
        assert [error["field"] for error in problem["errors"]] == [field], problem
    broken = await http.post(path, content=MALFORMED["not-json"], headers=JSON | gateway.admin)
    assert assert_problem(broken, 422, "bad_request")["errors"][0]["field"].startswith("body")


async def test_the_bodies_are_still_described(http: httpx.AsyncClient) -> None:
    schema = (await http.get("/openapi.json")).json()
    for path in (
        "/v1/admin/tenants/{tenant}/keys",
        "/v1/admin/tenants/{tenant}/holds/{hold_id}/resolve",
        "/v1/admin/tenants/{tenant}/rules",
    ):
        body = schema["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        described = body["content"]["application/json"]["schema"]
        assert "properties" in described or "$ref" in described, (path, described)
