"""Refusals, seen: every refusal the gateway gives an agent of a tenant, on HTTP (every
problem+json answer passes gateway/edge/problems.py's `refused`) and on MCP (a tool result
with a reason, gateway/routes/mcp_server.py's `call_tool`), counted by reason, transport,
agent and route, before the ledger or by it.

A refusal costs a dict increment in this process (RefusalTally), never a Redis write on
the request's path. Every IRREV_REFUSALS_FLUSH_S a Flusher adds what the process counted
to the fleet's counts in Redis (ledger/refusals.py: per tenant and minute of Redis's
clock) in one round trip for all tenants, so a flood of refusals is one write a
second per process, and every worker and host adds to the same minutes. Memory is
bounded here (MAX_PENDING keys between flushes; past it a refusal is counted under its
reason with agent and route '*') and in Redis (the script's own bound, and an hour's
expiry).

Labels are bounded by the tenant's policy, never by what an agent sends: the agent is
the one its credential names, the route is the catalog's route id, or `<tool> <METHOD>
(unlisted)` for a path the catalog does not list, `(unknown tool)`, or the endpoint's
own template (`POST /v1/holds`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request

from ledger import Ledger, LedgerUnavailable, RefusalCount, stop_tasks
from pricing import CALL, TenantPolicy

if TYPE_CHECKING:
    from gateway.pipeline.prepare import Gate

log = logging.getLogger("irrev.gateway")
HTTP = "http"
MCP = "mcp"
MINUTE_MS = 60_000
MAX_PENDING = 2048
OTHERS = "*"
UNKNOWN_TOOL = "(unknown tool)"
MAX_ROUTE_CHARS = 200
# MCP tools are named `<server>__<tool>` (gateway/routes/mcp_server.py's SEPARATOR); an MCP
# call's route is `<server> CALL /<tool>` (pricing/templates.py's CALL).
MCP_SEPARATOR = "__"
# Where MCP is served (gateway/app.py): a POST refused before the SDK reads it (its
# JSON, its size) is an MCP refusal all the same.
MCP_PATH = "/mcp"

# (tenant, reason, transport, agent, route)
Key = tuple[str, str, str, str, str]


@dataclass
class RefusalTally:
    """This process's refusals since the last flush, by tenant, reason, transport,
    agent and route. At most `max_keys` keys, then one per tenant, reason and
    transport (reasons are the gateway's own codes: few)."""

    max_keys: int = MAX_PENDING
    pending: dict[Key, int] = field(default_factory=dict)

    def note(self, tenant: str, agent: str, route: str, reason: str, transport: str) -> None:
        self._add((tenant, reason, transport, agent, route[:MAX_ROUTE_CHARS]), 1)

    def _add(self, key: Key, count: int) -> None:
        if key not in self.pending and len(self.pending) >= self.max_keys:
            key = (*key[:3], OTHERS, OTHERS)
        self.pending[key] = self.pending.get(key, 0) + count

    def take(self) -> dict[str, list[RefusalCount]]:
        """What was counted, by tenant; the tally starts again from nothing."""
        taken, self.pending = self.pending, {}
        out: dict[str, list[RefusalCount]] = {}
        for (tenant, reason, transport, agent, route), count in taken.items():
            out.setdefault(tenant, []).append(RefusalCount(reason, transport, agent, route, count))
        return out

    def restore(self, counts: Mapping[str, list[RefusalCount]]) -> None:
        """Counts taken by a flush that failed, back for the next one."""
        for tenant, batch in counts.items():
            for c in batch:
                self._add((tenant, c.reason, c.transport, c.agent, c.route), c.count)


def tool_route(policy: TenantPolicy | None, tool: str, method: str, path: str) -> str:
    """The route a request of `tool` is refused on: the catalog's route id, or what
    names it without the agent's own words."""
    if policy is None or tool not in policy.document.tools:
        return UNKNOWN_TOOL
    try:
        found = policy.catalog.match(tool, method, path)
    except Exception:  # a refusal is counted whatever the path; never a 500 for it
        found = None
    return found[0].route_id if found else f"{tool} {method} (unlisted)"


def http_route(request: Request, policy: TenantPolicy | None) -> str:
    if request.scope.get("path") == MCP_PATH:
        return f"{request.method} {MCP_PATH}"  # refused before the SDK read which tool
    params = request.path_params
    if "tool" in params and "path" in params:  # the proxy, /tools/{tool}/{path}
        return tool_route(policy, str(params["tool"]), request.method, f"/{params['path']}")
    template = getattr(request.scope.get("route"), "path", None)
    return f"{request.method} {template}" if template else f"{request.method} -"


def seen(request: Request, reason: str) -> None:
    """A problem+json refusal (problems.refused): counted if the credential named an
    agent; MCP's own when `/mcp` refused the POST before the SDK read it."""
    agent = getattr(request.state, "agent", "")
    gate: Gate | None = getattr(request.app.state, "gate", None)
    if not agent or gate is None:
        return  # no agent (an admin, a settler) or not authenticated: no tenant's agent
    with _never_raising():
        tenant = request.state.tenant
        route = http_route(request, gate.tenants.policies.get(tenant))
        transport = MCP if request.scope.get("path") == MCP_PATH else HTTP
        gate.refusals.note(tenant, agent, route, reason, transport)


class ToolResult(Protocol):
    """What seen_call reads of an MCP CallToolResult."""

    @property
    def is_error(self) -> bool: ...
    @property
    def structured_content(self) -> dict[str, Any] | None: ...


def seen_call(gate: Gate, policy: TenantPolicy, agent: str, name: str, result: ToolResult) -> None:
    """An MCP tool result: counted if it is a refusal (an error with a reason; an
    escalation that waits is none)."""
    reason = (result.structured_content or {}).get("reason") if result.is_error else None
    if not isinstance(reason, str) or not reason:
        return
    with _never_raising():
        server, _, tool = name.partition(MCP_SEPARATOR)
        route = tool_route(policy, server, CALL, f"/{tool}")
        gate.refusals.note(policy.tenant, agent, route, reason, MCP)


@contextlib.contextmanager
def _never_raising() -> Iterator[None]:
    """Counting is beside the answer: a fault here is logged, and the refusal answered
    as it would have been."""
    try:
        yield
    except Exception:
        log.exception("a refusal was not counted")


class Flusher:
    """Adds a RefusalTally to the fleet's counts in Redis, every `interval_s` and once
    more when the process stops. Minutes are Redis's: each flush's script reads
    Redis's clock, and the next flush's minute is that clock carried forward on this
    process's monotonic one (the first flush asks Redis). A refusal lands in the
    minute of the flush that carries it: at most `interval_s` late."""

    def __init__(self, tally: RefusalTally, ledger: Ledger, interval_s: float) -> None:
        self.tally = tally
        self.ledger = ledger
        self.interval_s = interval_s
        self._offset_ms: float | None = None  # Redis's clock minus time.monotonic()
        self._down = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task])
        with contextlib.suppress(Exception):
            await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception:
                log.exception("refusal counts not flushed")

    async def flush(self) -> None:
        if not self.tally.pending:
            return
        counts = self.tally.take()
        try:
            if self._offset_ms is None:
                self._saw(await self.ledger.now_ms())
            assert self._offset_ms is not None
            minute = int(time.monotonic() * 1000 + self._offset_ms) // MINUTE_MS
            now_ms = await self.ledger.refusals.add(minute, counts)
        except LedgerUnavailable as exc:
            self.tally.restore(counts)
            if not self._down:  # one line per outage, not one per flush
                log.warning(
                    "refusal counts kept in memory until Redis is back", extra={"why": str(exc)}
                )
            self._down = True
            return
        if self._down:
            log.info("refusal counts flushed again")
        self._down = False
        if now_ms:
            self._saw(now_ms)

    def _saw(self, redis_ms: int) -> None:
        self._offset_ms = redis_ms - time.monotonic() * 1000
