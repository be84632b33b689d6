"""Where each tool of the policies in force sends its requests: an HTTP target, or
an MCP server (over HTTP, or a stdio process of this worker's), built once per load,
not per forward. An MCP server configured as before is kept across a reload (its
connections, its learnt protocol version, its running process)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.edge.wire import KEPT_RESPONSE_HEADERS
from gateway.state.credentials import Injected
from gateway.state.http_upstream import HttpTarget
from gateway.state.supervision import Supervision
from ledger import stop_tasks
from pricing import McpErrorMeaning, TenantPolicy

if TYPE_CHECKING:
    from gateway.state.mcp_upstream import McpUpstream

# tenant -> tool -> what is added to its requests (state/credentials.py).
InjectedByTenant = dict[str, dict[str, Injected]]


class Upstreams:
    """`targets` and `mcp` by (tenant, tool), which a forward reads (TenantStore.target,
    .mcp_upstream); the rest runs when policies load."""

    def __init__(self, supervision: Supervision) -> None:
        self.supervision = supervision
        self.targets: dict[tuple[str, str], HttpTarget] = {}
        self.mcp: dict[tuple[str, str], McpUpstream] = {}
        self._closing: set[asyncio.Task[None]] = set()
        # The servers a reload dropped, until their retire has closed them (by id: an
        # upstream compares by its fields): a shutdown closes those whose retire never
        # ran, cancelled before its first step.
        self._retiring: dict[int, McpUpstream] = {}

    def rebuild(
        self, policies: Iterable[TenantPolicy], credentials: InjectedByTenant, grace_s: float
    ) -> None:
        """The upstreams of `policies`; the MCP servers no longer used are closed once
        the deliveries begun through them have ended, at most `grace_s`."""
        policies = list(policies)
        self.targets = _targets(policies, credentials)
        fresh = _mcp_upstreams(policies, credentials, self.supervision)
        self.mcp = self._keep_unchanged(fresh, grace_s)

    def _keep_unchanged(
        self, fresh: dict[tuple[str, str], McpUpstream], grace_s: float
    ) -> dict[tuple[str, str], McpUpstream]:
        """`fresh`, where a server is configured as before the one already in use (its
        connections and learnt protocol version, its running process); the others are
        closed once the deliveries begun through them have ended (they leaked on every
        reload): a stdio server whose command, environment or directory changed is
        stopped, and its successor started on first use."""
        kept = {}
        for key, upstream in fresh.items():
            old = self.mcp.get(key)
            kept[key] = old if old is not None and old.same_server(upstream) else upstream
        in_use = {id(upstream) for upstream in kept.values()}
        dropped = [upstream for upstream in self.mcp.values() if id(upstream) not in in_use]
        if dropped:
            self._retiring.update((id(upstream), upstream) for upstream in dropped)
            task = asyncio.get_running_loop().create_task(self._retire(dropped, grace_s))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return kept

    async def aclose(self) -> None:
        """Close every MCP server (clients, processes), the retired ones' at once (at
        shutdown)."""
        # Cancelled again until they end: a cancel swallowed in Python 3.11 waited for
        # ever. A server's failure to close stays in its _retire (return_exceptions),
        # so none stops the shutdown, as before.
        await stop_tasks(self._closing)
        unretired = list(self._retiring.values())
        await asyncio.gather(*(upstream.aclose() for upstream in unretired), return_exceptions=True)
        self._retiring = {}
        await asyncio.gather(*(upstream.aclose() for upstream in self.mcp.values()))
        self.mcp = {}

    async def _retire(self, upstreams: list[McpUpstream], grace_s: float) -> None:
        """Close retired MCP servers (an HTTP client, a stdio server's process) once
        the deliveries through them have ended, at most `grace_s` (fire() gives one at
        most upstream_timeout_s); at once if cancelled."""
        await asyncio.gather(
            *(self._retire_one(u, grace_s) for u in upstreams), return_exceptions=True
        )

    async def _retire_one(self, upstream: McpUpstream, grace_s: float) -> None:
        try:
            await upstream.retire(grace_s)
        finally:
            # Reached only once the retire ran, which closes the server even when
            # cancelled; one cancelled before its first step stays for aclose.
            self._retiring.pop(id(upstream), None)


def _targets(
    policies: Iterable[TenantPolicy], credentials: InjectedByTenant
) -> dict[tuple[str, str], HttpTarget]:
    """Each tool's upstream as the gateway calls it: its URL, its credentials, the
    answer headers kept, what means "still in progress"."""
    return {
        (policy.tenant, name): HttpTarget(
            tool.upstream,
            credentials.get(policy.tenant, {}).get(name, ()),
            KEPT_RESPONSE_HEADERS | {header.lower() for header in tool.response_headers},
            frozenset(tool.in_progress_statuses),
        )
        for policy in policies
        for name, tool in policy.document.tools.items()
        if tool.upstream is not None
    }


def _mcp_upstreams(
    policies: Iterable[TenantPolicy], credentials: InjectedByTenant, supervision: Supervision
) -> dict[tuple[str, str], McpUpstream]:
    """Each MCP server of each tenant: over HTTP with its credentials as headers, or
    over stdio (a process of this worker's, not started yet) with them in its
    environment; and the tools whose `isError` means "not executed" (route field
    `is_error`). The MCP SDK is imported only where a tenant has an MCP server (it is
    most of a worker's import time)."""
    policies = list(policies)
    if not any(tool.is_mcp for policy in policies for tool in policy.document.tools.values()):
        return {}
    from gateway.state.mcp_http import HttpConnection
    from gateway.state.mcp_stdio import Command, StdioConnection
    from gateway.state.mcp_upstream import Connection, McpUpstream

    upstreams = {}
    for policy in policies:
        for name, tool in policy.document.tools.items():
            injected = credentials.get(policy.tenant, {}).get(name, ())
            connection: Connection
            if tool.mcp is not None:
                connection = HttpConnection(tool.mcp, injected)
            elif tool.mcp_command is not None:
                command = Command(tuple(tool.mcp_command), injected, tool.mcp_cwd)
                connection = StdioConnection(command, f"{policy.tenant}/{name}", supervision)
            else:
                continue
            not_executed = frozenset(
                route.template.text.removeprefix("/")
                for route in policy.catalog.by_tool.get(name, ())
                if policy.document.routes[route.index].is_error is McpErrorMeaning.NOT_EXECUTED
            )
            upstreams[(policy.tenant, name)] = McpUpstream(connection, not_executed, tool.dedupes)
    return upstreams
