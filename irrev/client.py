"""The agent's side of irrev for HTTP tools: one call per tool call of the model.

`IrrevClient.call` sends an effect through the gateway (`/tools/<tool>/<path>`) with
the Idempotency-Key taken from the model's tool-call id, so every retry of one tool
call is one effect (contract 3) and a new tool call is a new one. It then does what
an agent should do with the gateway's answers, so that the model only reads a
sentence:

- 202 with `X-Irrev-Decision: escalate` (escalated): polls the escalation on the
  gateway (its `Location`, a `/v1/escalations/...` path, on `base_url`) until a
  human decided, for at most `wait_s` and `max_polls` polls;
- 409 `in_flight`, 502/504 `upstream_ambiguous`, 503 `ledger_unavailable`: the same
  request again with the same key, after `Retry-After` (at most `attempts` times):
  the gateway deduplicates, and an ambiguous effect is sent upstream again under
  the same key;
- any other refusal of the gateway's: a sentence with the reason, the price and
  what was left (`Outcome.text`), and the reason code (`Outcome.reason`).

Only the gateway's own answers are decisions. The gateway passes a tool API's answer
through (its status, body, `Location` and `Retry-After`) but never a tool's `X-Irrev-*`
headers, so a tool cannot pass for the gateway: a tool's 202 is the tool's answer
(the effect was made; the tool accepted it), never followed, and a tool's
problem+json is the tool's answer (the effect may have happened), not a refusal.
The token goes to `base_url` only: a `Location` elsewhere is never followed.

Nothing here imports an agent framework; irrev/langchain.py adapts it to one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"
# Answers worth the same request again under the same key: nothing was decided yet,
# or the effect's outcome is unknown and the gateway will ask again under the key.
RETRIED = frozenset({"in_flight", "upstream_ambiguous", "ledger_unavailable"})
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# Where the gateway's escalations are polled: its own path, relative to base_url.
_ESCALATION_PATH = re.compile(r"/v1/escalations/[A-Za-z0-9_~-][A-Za-z0-9._~-]*")
# Delay-seconds (RFC 9110): ASCII digits only (str.isdigit() takes '²', which float()
# refuses); an HTTP-date or anything else means the client's own pause.
_DELAY_SECONDS = re.compile(r"[0-9]{1,9}")
MAX_PAUSE_S = 30.0
# X-Irrev-Escalation on a poll's 202: nobody decided yet, or approved and on its way.
_UNDECIDED = frozenset({"escalated", "pending"})


def idempotency_key(tool_call_id: str) -> str:
    """The Idempotency-Key of a tool call: its id if the gateway takes it as one (1-255
    printable ASCII), else a digest of it (the same id gives the same key)."""
    if _KEY.fullmatch(tool_call_id):
        return tool_call_id
    return "tc-" + hashlib.sha256(tool_call_id.encode()).hexdigest()


@dataclass(frozen=True)
class Outcome:
    """What became of one tool call. `text` is for the model: the tool's answer, or a
    sentence saying why there is none. `reason` is the gateway's reason code when the
    effect was refused or is pending (`escalated`), else None."""

    ok: bool
    status: int
    text: str
    data: Any = None
    reason: str | None = None
    escalation: str | None = None


def problem_sentence(tool: str, problem: dict[str, Any]) -> str:
    """A refusal as one sentence for the model, with the numbers behind it."""
    reason = problem.get("reason", "unknown")
    sentence = f"The {tool} call was not made ({reason}): {problem.get('detail', '')}".rstrip()
    numbers = [
        f"{label} {problem[field]}"
        for field, label in (("price", "price"), ("available", "left"), ("limit", "limit"))
        if isinstance(problem.get(field), int)
    ]
    if numbers:
        sentence += f" ({', '.join(numbers)}, in the tenant's minor risk units)"
    if reason in RETRIED:
        sentence += ". It may still happen: retry this same tool call later, never a new one"
    return sentence + "."


def retry_after_s(response: httpx.Response, default_s: float) -> float:
    """The answer's Retry-After in seconds (at most MAX_PAUSE_S), or `default_s`."""
    given = response.headers.get("retry-after", "").strip()
    return min(float(given), MAX_PAUSE_S) if _DELAY_SECONDS.fullmatch(given) else default_s


def _escalated(response: httpx.Response) -> bool:
    """The gateway held the effect for a human (a tool's 202 never says so: the gateway
    strips X-Irrev-* from tool answers)."""
    return response.status_code == 202 and response.headers.get("x-irrev-decision") == "escalate"


def _undecided(response: httpx.Response) -> bool:
    """A poll of the escalation answered that it is still waiting (else the answer is
    the outcome: the tool's answer, or the gateway's refusal)."""
    return response.status_code == 202 and response.headers.get("x-irrev-escalation") in _UNDECIDED


@dataclass
class IrrevClient:
    """An agent's connection to the gateway: its base URL, its Bearer token, and how
    long it waits for humans and retries."""

    base_url: str
    token: str
    http: httpx.AsyncClient | None = None
    wait_s: float = 60.0
    attempts: int = 5
    pause_s: float = 1.0
    # However short a Retry-After: no loop against the gateway spins.
    min_pause_s: float = 0.5
    max_polls: int = 60

    def _client(self) -> httpx.AsyncClient:
        if self.http is None:
            self.http = httpx.AsyncClient(base_url=self.base_url, timeout=30.0, trust_env=False)
        return self.http

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def call(
        self,
        tool: str,
        method: str,
        path: str,
        tool_call_id: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
    ) -> Outcome:
        """Make one tool call's effect through the gateway (`path` as the tool API
        names it, e.g. `/orders`), retrying and polling as the module says."""
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Idempotency-Key": idempotency_key(tool_call_id),
        }
        url = f"/tools/{tool}/{path.lstrip('/')}"
        response = await self._send(method, url, json=json_body, params=params, headers=headers)
        for _ in range(self.attempts):
            if _problem(response).get("reason") not in RETRIED:
                break
            await asyncio.sleep(self._pause(response))
            response = await self._send(method, url, json=json_body, params=params, headers=headers)
        if not _escalated(response):
            return self._outcome(tool, response)
        escalation = str(_json(response).get("escalation", ""))
        location = response.headers.get("location", "")
        if _ESCALATION_PATH.fullmatch(location):
            response = await self._await_human(response, location)
        if _escalated(response) or _undecided(response):
            text = (
                f"The {tool} call waits for a human's approval (escalation {escalation}); "
                "nothing was done yet. Retry this same tool call later to get its result."
            )
            return Outcome(
                False, response.status_code, text, _json(response), "escalated", escalation
            )
        return self._outcome(tool, response)

    async def _send(self, method: str, url: str, **options: Any) -> httpx.Response:
        # Relative URLs only, on base_url, and no redirect followed: the token is never
        # sent anywhere else.
        return await self._client().request(method, url, follow_redirects=False, **options)

    def _pause(self, response: httpx.Response) -> float:
        return max(retry_after_s(response, self.pause_s), self.min_pause_s)

    async def _await_human(self, response: httpx.Response, location: str) -> httpx.Response:
        """Poll the escalation at `location` (the gateway's own path) until it is
        decided, for at most `wait_s` seconds and `max_polls` polls."""
        deadline = time.monotonic() + self.wait_s
        for _ in range(self.max_polls):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(self._pause(response), remaining))
            response = await self._send(
                "GET", location, headers={"Authorization": f"Bearer {self.token}"}
            )
            if not _undecided(response):
                break
        return response

    def _outcome(self, tool: str, response: httpx.Response) -> Outcome:
        """The gateway's refusal as a sentence, or the tool's own answer."""
        status = response.status_code
        problem = _problem(response)
        if problem:
            sentence = problem_sentence(tool, problem)
            return Outcome(False, status, sentence, problem, problem["reason"])
        try:
            data: Any = response.json()
        except ValueError:
            data = response.text
        text = data if isinstance(data, str) else json.dumps(data)
        if status == 202:
            text = (
                f"The {tool} tool accepted the call (202): it was sent and the tool took it "
                f"on; it is not waiting for anyone's approval. The tool's answer: {text}"
            )
        elif not 200 <= status < 300:
            text = (
                f"The {tool} tool itself answered {status} (the tool's answer, not a refusal "
                f"by irrev; the effect may have happened). The tool's answer: {text}"
            )
        omitted = response.headers.get("x-irrev-body-omitted")
        if omitted is not None:
            text = (
                f"The {tool} call was made before and answered {status}; its answer's body "
                f"({omitted} bytes) was too big to keep, so this repeat has none. "
                "Do not call it again to see it."
            )
        return Outcome(200 <= status < 300, status, text, data)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The gateway's own problem+json, or {} for any other answer. The gateway names
    its reason in X-Irrev-Reason, a header no tool's answer can carry through it; a
    tool's problem+json is the tool's answer, whatever its body says."""
    if not response.headers.get("content-type", "").startswith(PROBLEM_JSON):
        return {}
    body = _json(response)
    reason = body.get("reason")
    given = response.headers.get("x-irrev-reason")
    return body if isinstance(reason, str) and given == reason else {}
