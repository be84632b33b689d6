"""How the gateway keeps the stdio MCP servers it runs alive (gateway/state/mcp_stdio.py),
apart from it: settings and the tenant store name it without importing the MCP SDK."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Supervision:
    """A restart waits `backoff_s`, doubled for each restart already made within
    `window_s` (at most `backoff_max_s`); after `max_restarts` within `window_s` the
    server stays down (calls refused at once) until the oldest leaves the window; a
    start, from spawning the process to the end of the MCP handshake, gets
    `start_timeout_s`."""

    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    start_timeout_s: float = 10.0
