"""Pure parts of the gateway's wire format: what is kept with a hold."""

from __future__ import annotations

from gateway.wire import MAX_RECORDED_BODY, StoredAnswer


def test_huge_answers_are_recorded_without_their_body() -> None:
    body = b"x" * (MAX_RECORDED_BODY + 1)
    stored = StoredAnswer.loads(
        StoredAnswer.of("a1", 201, [("Content-Type", "text/plain")], body).dumps()
    )
    assert (stored.status, stored.body) == (201, b"")
    assert stored.headers == [
        ("content-type", "text/plain"),
        ("x-irrev-body-omitted", str(len(body))),
    ]


def test_answers_keep_only_headers_that_describe_the_body() -> None:
    headers = [("Content-Type", "application/json"), ("Set-Cookie", "s=1"), ("Location", "/o/1")]
    stored = StoredAnswer.of("a1", 201, headers, b"{}")
    assert stored.headers == [("content-type", "application/json"), ("location", "/o/1")]
    assert StoredAnswer.loads(stored.dumps()) == stored
