"""The agent's side of irrev for HTTP tools: one call per tool call of the model.

`IrrevClient.call` sends an effect through the gateway (`/tools/<tool>/<path>`) with
the Idempotency-Key taken from the model's tool-call id, so every retry of one tool
call is one effect (contract 3) and a new tool call is a new one. It then does what
an agent should do with the gateway's answers, so that the model only reads a
sentence:

- 202 (escalated): polls the escalation until a human decided (up to `wait_s`);
- 409 `in_flight`, 502/504 `upstream_ambiguous`, 503 `ledger_unavailable`: the same
  request again with the same key, after `Retry-After` (at most `attempts` times):
  the gateway deduplicates, and an ambiguous effect is sent upstream again under
  the same key;
- any other `application/problem+json`: a sentence with the reason, the price and
  what was left (`Outcome.text`), and the reason code (`Outcome.reason`).

Nothing here imports an agent framework; irrev/langchain.py adapts it to one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"
# Answers worth the same request again under the same key: nothing was decided yet,
# or the effect's outcome is unknown and the gateway will ask again under the key.
RETRIED = frozenset({"in_flight", "upstream_ambiguous", "ledger_unavailable"})
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


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


def _retry_after(response: httpx.Response, default_s: float) -> float:
    given = response.headers.get("retry-after", "")
    return min(float(given), 30.0) if given.isdigit() else default_s


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
        response = await self._client().request(
            method, url, json=json_body, params=params, headers=headers
        )
        for _ in range(self.attempts):
            reason = _problem(response).get("reason")
            if reason not in RETRIED:
                break
            await asyncio.sleep(_retry_after(response, self.pause_s))
            response = await self._client().request(
                method, url, json=json_body, params=params, headers=headers
            )
        if response.status_code == 202:
            response = await self._await_human(response)
        return self._outcome(tool, response)

    async def _await_human(self, response: httpx.Response) -> httpx.Response:
        """Poll an escalation until it is decided and the effect made, or `wait_s`."""
        location = response.headers.get("location", "")
        waited = 0.0
        while response.status_code == 202 and location and waited < self.wait_s:
            pause = _retry_after(response, self.pause_s)
            await asyncio.sleep(pause)
            waited += pause
            response = await self._client().get(
                location, headers={"Authorization": f"Bearer {self.token}"}
            )
        return response

    def _outcome(self, tool: str, response: httpx.Response) -> Outcome:
        status = response.status_code
        if status == 202:
            body = response.json()
            escalation = str(body.get("escalation", ""))
            text = (
                f"The {tool} call waits for a human's approval (escalation {escalation}); "
                "nothing was done yet. Retry this same tool call later to get its result."
            )
            return Outcome(False, status, text, body, "escalated", escalation)
        problem = _problem(response)
        if problem:
            sentence = problem_sentence(tool, problem)
            return Outcome(False, status, sentence, problem, problem["reason"])
        try:
            data: Any = response.json()
        except ValueError:
            data = response.text
        text = data if isinstance(data, str) else json.dumps(data)
        return Outcome(200 <= status < 300, status, text, data)


def _problem(response: httpx.Response) -> dict[str, Any]:
    """The gateway's problem+json, or {} for any other answer."""
    if not response.headers.get("content-type", "").startswith(PROBLEM_JSON):
        return {}
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) and "reason" in body else {}
