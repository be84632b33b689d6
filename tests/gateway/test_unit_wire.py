"""Pure parts of the gateway's wire format: what is kept with a hold."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from gateway.edge.problems import PROBLEM_JSON
from gateway.edge.responses import stored_response
from gateway.edge.wire import MAX_RECORDED_BODY, StoredAnswer, StoredRequest


def test_huge_answers_are_recorded_without_their_body() -> None:
    body = b"x" * (MAX_RECORDED_BODY + 1)
    stored = StoredAnswer.loads(
        StoredAnswer.of("a1", 201, [("Content-Type", "text/plain")], body).dumps()
    )
    assert (stored.status, stored.body) == (201, b"")
    assert stored.headers == [
        ("content-type", "text/plain"),
        ("x-irrev-body-omitted", str(len(body))),
        ("x-irrev-body-sha256", hashlib.sha256(body).hexdigest()),
        ("x-irrev-body-omitted-reason", "too_large"),
    ]


def test_answers_keep_only_headers_that_describe_the_body() -> None:
    headers = [("Content-Type", "application/json"), ("Set-Cookie", "s=1"), ("Location", "/o/1")]
    stored = StoredAnswer.of("a1", 201, headers, b"{}")
    assert stored.headers == [("content-type", "application/json"), ("location", "/o/1")]
    assert StoredAnswer.loads(stored.dumps()) == stored


# An answer as gateways wrote it before the compact form (issue 12), byte for byte.
LONG_FORM = (
    '{"agent":"a1","status":201,"headers":[["content-type","application/json"]],'
    '"body_b64":"eyJvcmRlciI6IjEyMyJ9","route_id":"shop POST /v1/orders",'
    '"face_value":1000,"effect_class":"irreversible","in_process":true}'
)


def test_answers_kept_in_the_long_form_still_load() -> None:
    stored = StoredAnswer.loads(LONG_FORM)
    assert (stored.agent, stored.status, stored.body) == ("a1", 201, b'{"order":"123"}')
    assert stored.headers == [("content-type", "application/json")]
    assert (stored.route_id, stored.face_value) == ("shop POST /v1/orders", 1000)
    assert (stored.effect_class, stored.in_process) == ("irreversible", True)
    assert StoredAnswer.loads(stored.dumps()) == stored


def test_the_compact_form_keeps_every_field_in_fewer_bytes() -> None:
    stored = StoredAnswer.loads(LONG_FORM)
    assert len(stored.dumps()) < len(LONG_FORM) * 3 // 4
    # Defaults are left out, and read back as defaults.
    bare = StoredAnswer.of("a1", 204, [], b"")
    assert bare.dumps() == '{"a":"a1","s":204}\n'
    assert StoredAnswer.loads(bare.dumps()) == bare


def test_bodies_of_any_bytes_survive_the_compact_form() -> None:
    for body in (b"\xff\x00binary", b"line 1\nline 2\r\n", "caf\u00e9 \u2603".encode(), b"{}"):
        stored = StoredAnswer.of("a|1", 200, [("Content-Type", "text/plain")], body, "r\nx")
        loaded = StoredAnswer.loads(stored.dumps())
        assert loaded == stored and loaded.body == body


def test_headers_keep_their_order_whichever_comes_first() -> None:
    for headers in (
        [("Content-Type", "application/json"), ("Location", "/o/1")],
        [("Location", "/o/1"), ("Content-Type", "application/json")],
        [("ETag", '"v1"')],
    ):
        stored = StoredAnswer.of("a1", 201, headers, b"{}")
        assert StoredAnswer.loads(stored.dumps()).headers == [
            (name.lower(), value) for name, value in headers
        ]


def test_the_gateways_own_problem_keeps_its_reason_in_a_few_bytes() -> None:
    body = b'{"reason":"not_replicated"}'
    headers = [("content-type", "application/problem+json")]
    tool = StoredAnswer.of("a1", 503, headers, body)
    own = StoredAnswer.of("a1", 503, headers, body, reason="not_replicated")
    assert StoredAnswer.loads(own.dumps()).reason == "not_replicated"
    assert StoredAnswer.loads(tool.dumps()).reason == ""  # a tool's answer: none
    assert len(own.dumps()) - len(tool.dumps()) == len(',"g":"not_replicated"')


def test_a_kept_refusal_comes_back_a_whole_problem_document() -> None:
    """What a record keeps of the gateway's refusal (here: reason and detail only, as
    upstream_unreachable's is kept) is enough: type, title and status are rebuilt from
    its reason and status, the rest (detail, numbers) is the kept one."""
    body = b'{"reason":"upstream_unreachable","detail":"nothing was sent","hold":"h1"}'
    stored = StoredAnswer.loads(
        StoredAnswer.of(
            "a1", 502, [("content-type", PROBLEM_JSON)], body, reason="upstream_unreachable"
        ).dumps()
    )
    response = stored_response(stored, {"X-Irrev-Replayed": "true"})
    assert response.status_code == 502
    assert response.headers["content-type"] == PROBLEM_JSON
    assert response.headers["x-irrev-reason"] == "upstream_unreachable"
    assert response.headers["x-irrev-replayed"] == "true"
    assert json.loads(bytes(response.body)) == {
        "type": "https://irrev.dev/problems/upstream_unreachable",
        "title": "upstream unreachable",
        "status": 502,
        "reason": "upstream_unreachable",
        # What a model reads: the kept detail and its next step (gateway/edge/advice.py).
        "detail": "nothing was sent. Nothing was done; the same call may succeed later.",
        "retry": "later",
        "hold": "h1",
    }


def test_a_kept_not_replicated_is_replayed_without_the_released_holds_decision() -> None:
    stored = StoredAnswer.of("a1", 503, [], b'{"detail":"released"}', reason="not_replicated")
    decided = {"X-Irrev-Decision": "admit", "X-Irrev-Price": "5", "X-Irrev-Remaining": "9"}
    extra = {**decided, "X-Irrev-Hold": "h1", "X-Irrev-Replayed": "true"}
    response = stored_response(stored, extra)
    assert not {name.lower() for name in decided} & set(response.headers.keys())
    assert response.headers["x-irrev-hold"] == "h1"
    assert response.headers["x-irrev-reason"] == "not_replicated"


def test_a_request_record_names_alone_only_where_it_is_set() -> None:
    """A worker of the release before `alone` reads every record but an alone one's
    (its `loads` takes no field it does not know), and they are no longer."""
    request = StoredRequest(
        agent="a1",
        tool="t",
        method="POST",
        path="/o",
        query="",
        content_type="",
        body_b64="",
        route_id="r",
        price=1,
    )
    assert "alone" not in json.loads(request.dumps())
    assert not StoredRequest.loads(request.dumps()).alone
    alone = replace(request, alone=True)
    assert json.loads(alone.dumps())["alone"] is True
    assert StoredRequest.loads(alone.dumps()) == alone
