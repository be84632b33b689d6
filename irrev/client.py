"""The agent's side of irrev for HTTP tools: one call per tool call of the model.

`IrrevClient.call` sends an effect through the gateway (`/tools/<tool>/<path>`) with
an Idempotency-Key that names the call, so every retry of one tool call is one effect
(contract 3) and a new tool call is a new one. The key is the model's tool-call id
(`idempotency_key`), or, for a step of a durable run that has none, `step_key` of
what every re-run of that step shares (LangGraph: thread id, node, step). It then does
what an agent should do with the gateway's answers, so that the model only reads a
sentence:

- 202 with `X-Irrev-Decision: escalate` (escalated): polls the escalation on the
  gateway (its `Location`, a `/v1/escalations/...` path, on `base_url`) until a
  human decided, for at most `wait_s` (WAIT_S: 5 s) and `max_polls` polls; then an
  `escalated` Outcome with the escalation's id. The same call again later (same key)
  picks up that escalation, never a second one: the gateway answers a repeat of an
  escalated key with the same escalation, and once decided with its result;
- 409 `in_flight`, 502/504 `upstream_ambiguous`, 503 `ledger_unavailable`: the same
  request again with the same key, after `Retry-After` (at most `attempts` times):
  the gateway deduplicates, and an ambiguous effect is sent upstream again under
  the same key;
- any other refusal of the gateway's: its problem+json `detail` as the model's
  sentence (the gateway writes it for a model), its reason code (`Outcome.reason`),
  the numbers behind it for programs (`Outcome.figures`), and who decided and why
  when a human did (`by`, `note`).

`Outcome.replayed` says the gateway answered from its record of an earlier call of
the key (`X-Irrev-Replayed: true`): nothing was done again. The text is the same as
the first time, so a resumed run reaches the state an uninterrupted one would.

Only the gateway's own answers are decisions. The gateway passes a tool API's answer
through (its status, body, `Location` and `Retry-After`) but never a tool's `X-Irrev-*`
headers, so a tool cannot pass for the gateway: a tool's 202 is the tool's answer
(the effect was made; the tool accepted it), never followed, and a tool's
problem+json is the tool's answer (the effect may have happened), not a refusal.
The token goes to `base_url` only: a `Location` elsewhere is never followed.

Nothing here imports an agent framework; irrev/langchain.py, irrev/langgraph.py and
irrev/openai_agents.py adapt it to one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

import httpx

PROBLEM_JSON = "application/problem+json"
# Answers worth the same request again under the same key: nothing was decided yet,
# or the effect's outcome is unknown and the gateway will ask again under the key.
RETRIED = frozenset({"in_flight", "upstream_ambiguous", "ledger_unavailable"})
# Refusals after which the effect may still have happened (or be happening).
UNKNOWN_FATE = frozenset({"in_flight", "upstream_ambiguous"})
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# Where the gateway's escalations are polled: its own path, relative to base_url.
_ESCALATION_PATH = re.compile(r"/v1/escalations/[A-Za-z0-9_~-][A-Za-z0-9._~-]*")
# Delay-seconds (RFC 9110): ASCII digits only (str.isdigit() takes '²', which float()
# refuses); an HTTP-date or anything else means the client's own pause.
_DELAY_SECONDS = re.compile(r"[0-9]{1,9}")
MAX_PAUSE_S = 30.0
# How long a call waits for a human by default. Long enough for an approver that
# answers the escalation's webhook, or a person at the console, to decide while the
# call waits (the gateway asks for a poll every 2 s); short enough that an agent graph
# is not held for a minute on every escalation: it gets an `escalated` Outcome and
# calls again with the same key when it wants the result.
WAIT_S = 5.0
# X-Irrev-Escalation on a poll's 202: nobody decided yet, or approved and on its way.
_UNDECIDED = frozenset({"escalated", "pending"})
# How a framework adapter sends a tool's arguments: the route's `body_format`.
BodyFormat = Literal["json", "form"]


def idempotency_key(tool_call_id: str) -> str:
    """The Idempotency-Key of a tool call: its id if the gateway takes it as one (1-255
    printable ASCII), else a digest of it (the same id gives the same key)."""
    if _KEY.fullmatch(tool_call_id):
        return tool_call_id
    return "tc-" + hashlib.sha256(tool_call_id.encode()).hexdigest()


def step_key(*parts: str | int) -> str:
    """The Idempotency-Key of one step of a durable run that has no tool-call id, from
    what every re-run of that step shares and nothing else does: for LangGraph the
    thread id, the node and the step (irrev/langgraph.py `step_key_of`), or an
    interrupt's id that every resumer reads from the checkpoint. The same parts give
    the same key in any process, so a step re-run after a crash, or by k processes
    resuming one interrupt, is one effect.

    Never a part that differs per run: a fresh uuid, a time, or LangGraph's task id
    (each resumer gets its own), which make every re-run a new effect. To make a
    step's effect again on purpose, add a part only the new run has, e.g.
    `step_key(thread, node, step, attempt)` with `attempt` a counter in the run's
    state that the program raises when it means to repeat the effect.

    A digest (sha256 of the parts as a JSON array: "1" and 1 differ, and no separator
    in a thread id can make two lists of parts one key), 69 characters."""
    if not parts or any(
        isinstance(part, bool) or not isinstance(part, str | int) for part in parts
    ):
        raise ValueError(f"step_key takes one or more str or int parts, not {parts!r}")
    canonical = json.dumps(list(parts), separators=(",", ":"))
    return "step-" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Figures:
    """The numbers behind a refusal or an escalation, as the gateway gave them:
    integers in the tenant's minor units for programs, `*_text` in major units with
    the currency for people. Fields the answer did not carry are None."""

    price: int | None = None
    limit: int | None = None
    available: int | None = None
    price_text: str | None = None
    limit_text: str | None = None
    available_text: str | None = None
    currency: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Figures:
        def amount(name: str) -> int | None:
            value = body.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(name: str) -> str | None:
            value = body.get(name)
            return value if isinstance(value, str) else None

        return cls(
            amount("price"),
            amount("limit"),
            amount("available"),
            text("price_text"),
            text("limit_text"),
            text("available_text"),
            text("currency"),
        )


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What became of one tool call. `text` is for the model: the tool's answer, or a
    sentence saying why there is none. `reason` is the gateway's reason code when the
    effect was refused or is pending (`escalated`), else None; `replayed`, that the
    answer is the gateway's record of an earlier call of the key; `by` and `note`, who
    decided an escalation and in what words, when a human did."""

    ok: bool
    status: int
    text: str
    data: Any = None
    reason: str | None = None
    escalation: str | None = None
    replayed: bool = False
    figures: Figures = field(default_factory=Figures)
    by: str | None = None
    note: str | None = None


def problem_sentence(tool: str, problem: Mapping[str, Any]) -> str:
    """A refusal for the model: the gateway's `detail` verbatim (the gateway writes it
    for a model, amounts in major units with the currency, and the next step), with the
    human's name and note if the problem carries them and its detail does not."""
    reason = str(problem.get("reason", "unknown"))
    detail = str(problem.get("detail") or reason.replace("_", " ")).rstrip()
    if reason in UNKNOWN_FATE:
        sentence = f"The {tool} call's outcome is not known yet ({reason}): {detail}"
    else:
        sentence = f"The {tool} call was not made ({reason}): {detail}"
    return _with_human(sentence, _text_of(problem.get("by")), _text_of(problem.get("note")))


def _with_human(sentence: str, by: str | None, note: str | None) -> str:
    """`sentence` with who decided and their note, each unless it already says it."""
    if not sentence.endswith((".", "!", "?")):
        sentence += "."
    if by and by not in sentence:
        sentence += f" Decided by {by}."
    if note and note not in sentence:
        sentence += f" Their note: {note}"
    return sentence


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


def _replayed(response: httpx.Response) -> bool:
    return response.headers.get("x-irrev-replayed") == "true"


@dataclass
class IrrevClient:
    """An agent's connection to the gateway: its base URL, its Bearer token, and how
    long it waits for humans and retries."""

    base_url: str
    token: str
    http: httpx.AsyncClient | None = None
    wait_s: float = WAIT_S
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
        key: str,
        *,
        json_body: Any = None,
        form: Mapping[str, str | int] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Make one tool call's effect through the gateway (`path` as the tool API
        names it, e.g. `/orders`), retrying and polling as the module says. `key`: the
        model's tool-call id, or a `step_key`. The body is `json_body` as JSON, or
        `form` as `application/x-www-form-urlencoded` (for a route whose
        `body_format` is `form`), never both."""
        if json_body is not None and form is not None:
            raise ValueError("a call sends json_body or form, not both")
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Idempotency-Key": idempotency_key(key),
        }
        url = f"/tools/{tool}/{path.lstrip('/')}"
        body = {"json": json_body} if form is None else {"data": dict(form)}
        request = {"params": params, "headers": headers, **body}
        response = await self._send(method, url, **request)
        for _ in range(self.attempts):
            if _problem(response).get("reason") not in RETRIED:
                break
            await asyncio.sleep(self._pause(response))
            response = await self._send(method, url, **request)
        if not _escalated(response):
            return self._outcome(tool, response)
        return await self._escalation(tool, response)

    async def _send(self, method: str, url: str, **options: Any) -> httpx.Response:
        # Relative URLs only, on base_url, and no redirect followed: the token is never
        # sent anywhere else.
        return await self._client().request(method, url, follow_redirects=False, **options)

    def _pause(self, response: httpx.Response) -> float:
        return max(retry_after_s(response, self.pause_s), self.min_pause_s)

    async def _escalation(self, tool: str, response: httpx.Response) -> Outcome:
        """Wait for a human on an escalated call; its outcome, or `escalated`."""
        escalated = _json(response)
        escalation = str(escalated.get("escalation", ""))
        location = response.headers.get("location", "")
        if _ESCALATION_PATH.fullmatch(location):
            response = await self._await_human(response, location)
        if not (_escalated(response) or _undecided(response)):
            return self._outcome(tool, response)
        figures = Figures.of(escalated)
        priced = f", priced {figures.price_text}" if figures.price_text else ""
        text = (
            f"The {tool} call waits for a human's approval (escalation {escalation}{priced}); "
            "nothing was done yet. Retry this same tool call later to get its result."
        )
        return Outcome(
            ok=False,
            status=response.status_code,
            text=text,
            data=_json(response),
            reason="escalated",
            escalation=escalation,
            replayed=_replayed(response),
            figures=figures,
        )

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
            return Outcome(
                ok=False,
                status=status,
                text=problem_sentence(tool, problem),
                data=problem,
                reason=problem["reason"],
                replayed=_replayed(response),
                figures=Figures.of(problem),
                by=_text_of(problem.get("by")),
                note=_text_of(problem.get("note")),
            )
        try:
            data: Any = response.json()
        except ValueError:
            data = response.text
        by, note = _decided(response)
        return Outcome(
            ok=200 <= status < 300,
            status=status,
            text=_answer_text(tool, response, data, by, note),
            data=data,
            replayed=_replayed(response),
            by=by,
            note=note,
        )


def body_of(arguments: Mapping[str, Any], body: BodyFormat) -> dict[str, Any]:
    """A tool's arguments as `IrrevClient.call`'s body: JSON as given, or a form of
    their text (a form has no null: an argument left None is left out)."""
    if body == "json":
        return {"json_body": dict(arguments)}
    return {
        "form": {name: _form_text(value) for name, value in arguments.items() if value is not None}
    }


def _form_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _answer_text(
    tool: str, response: httpx.Response, data: Any, by: str | None, note: str | None
) -> str:
    """The tool's own answer for the model, said to be the tool's where it could be
    taken for irrev's, and with the approver's name and note if a human approved it."""
    status = response.status_code
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
        why = (
            "the agent's allowance of kept answers for today was used up"
            if response.headers.get("x-irrev-body-omitted-reason") == "kept_answer_allowance"
            else "it was too big to keep"
        )
        digest = response.headers.get("x-irrev-body-sha256")
        text = (
            f"The {tool} call was made before and answered {status}; it is not made again. "
            f"Its answer's body ({omitted} bytes"
            + (f", SHA-256 {digest}" if digest else "")
            + f") was not kept because {why}, so this repeat has none. "
            "Do not call it again to see it."
        )
    if by:
        text = _with_human(f"A human approved the {tool} call", by, note) + f" {text}"
    return text


def _decided(response: httpx.Response) -> tuple[str | None, str | None]:
    """Who approved an escalated call and their note, beside the tool's answer
    (percent-encoded UTF-8 headers, gateway/routes/escalations.py)."""
    by, note = (response.headers.get(f"x-irrev-{name}") for name in ("decided-by", "note"))
    return (unquote(by) if by else None), (unquote(note) if note else None)


def _text_of(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


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
