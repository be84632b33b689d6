"""How many requests of one agent a worker serves at once: a bound per agent (the
tenant's `request_limits.max_in_flight`), so that one agent's requests, however slow
or heavy, cannot take the event loop and the connections its tenant's other agents
need. Counted in the worker (no Redis call per request): with W workers an agent has
at most W times the bound in flight on one gateway."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.edge.problems import Problem
from pricing import AuthenticatedAgent, TenantPolicy


@dataclass
class AgentSlots:
    """Requests in flight per (tenant, agent) in this worker."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    @contextmanager
    def slot(self, policy: TenantPolicy, agent: AuthenticatedAgent) -> Iterator[None]:
        """One request of `agent` while the block runs; 429 too_many_in_flight (nothing
        read of its body, nothing held) if it already has its bound in flight."""
        key = (policy.tenant, agent.agent_id)
        bound = policy.document.request_limits.max_in_flight
        held = self.counts.get(key, 0)
        if held >= bound:
            raise Problem(
                429,
                "too_many_in_flight",
                f"this agent already has {bound} requests in flight at this gateway; "
                "send the next one when one of them has been answered",
                headers={"Retry-After": "1"},
            )
        self.counts[key] = held + 1
        try:
            yield
        finally:
            left = self.counts[key] - 1
            if left:
                self.counts[key] = left
            else:
                del self.counts[key]
