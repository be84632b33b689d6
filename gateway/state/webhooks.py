"""Webhooks: each tenant's approval-loop events (gateway/state/events.py), POSTed to the
policy's `webhook.url` one at a time, signed, retried with exponential backoff until
the receiver takes them (2xx); in journal order for each agent, and a page of the
journal at a time round robin across agents (`fair_order`), so that one agent's
flood does not hold back another's escalation.

Delivery is driven by the journal, not by the request that made the event: a
per-tenant cursor in Redis says which entry was delivered last, and a per-tenant
lease (ledger lua/webhook.lua) lets one dispatcher at a time deliver, whichever
gateway process or worker holds it. So events survive restarts and crashes, and
many gateways still make one stream. Delivery is at least once: a dispatcher that
dies after the receiver took an event but before it moved the cursor sends it
again; receivers deduplicate by the event's `id` (its journal entry id, also in
the Irrev-Event-Id header).

Signature (like Stripe's and Svix's): `Irrev-Signature: t=<unix seconds>,v1=<hex
HMAC-SHA256 of "<t>.<body>" under the tenant's secret>`. The secret is read from
the environment or a file (`webhook.secret`), never logged or returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import random
import re
import secrets
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.edge import metrics
from gateway.state.credentials import webhook_secret
from gateway.state.events import events_of
from gateway.state.tenants import TenantStore
from ledger import (
    ChangeFeed,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    read_journal,
    stop_tasks,
)
from pricing import PolicyError, TenantPolicy

log = logging.getLogger("irrev.gateway")
SIGNATURE_HEADER = "Irrev-Signature"
PAGE = 100
ANSWER_BYTES = 4096  # of a receiver's answer, read and dropped (see _skim)
DEFAULT_TOLERANCE_S = 300


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The Irrev-Signature header of `body` sent at `timestamp` (unix seconds)."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: bytes, header: str, body: bytes, now_s: float, tolerance_s: int = DEFAULT_TOLERANCE_S
) -> bool:
    """What a receiver checks: a v1 signature of this body under the secret, made
    within `tolerance_s` of now (an old delivery replayed by someone else fails)."""
    parts = dict(part.partition("=")[::2] for part in header.split(","))
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs(now_s - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).partition(",v1=")[2]
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass(frozen=True)
class Pacing:
    """How a dispatcher paces itself: the receiver's answer must come within
    `timeout_s`, the whole of it (`deadline_s`); a failed delivery waits `backoff_s`
    x 2^(attempt-1) (at most `backoff_max_s`, with jitter) before the next attempt;
    the lease lasts `lease_s` (at least 3 x timeout_s); an idle tenant is looked at
    every `poll_s`."""

    timeout_s: float
    backoff_s: float
    backoff_max_s: float
    lease_s: float
    poll_s: float

    @property
    def lease_ms(self) -> int:
        return int(max(self.lease_s, 3 * self.timeout_s) * 1000)

    @property
    def deadline_s(self) -> float:
        """The most one attempt may take, from connecting to the answer's last byte
        read: timeout_s, and never more than a third of the lease (renewed just
        before the attempt), so the lease cannot pass to another dispatcher, which
        would send the same event alongside, while this one still waits; the rest is
        margin for moving the cursor after it. httpx's own timeout bounds each read,
        not the whole: a receiver sending a byte every 4 s never tripped it."""
        return min(self.timeout_s, self.lease_ms / 3000)

    def backoff(self, attempt: int) -> float:
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0)


def dispatcher_id() -> str:
    """This process's name for leases: host, pid and a random part (a restarted
    process with the same pid is another dispatcher)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "host"
    return f"{host}:{os.getpid()}:{secrets.token_hex(4)}"


class Dispatcher:
    """One per gateway worker: a task per tenant with a webhook, each delivering
    only while it holds that tenant's lease."""

    def __init__(
        self,
        ledger: Ledger,
        tenants: TenantStore,
        pacing: Pacing,
        feed: ChangeFeed | None = None,
    ) -> None:
        self.ledger = ledger
        self.tenants = tenants
        self.pacing = pacing
        self.feed = feed
        self._down_since: float | None = None
        self.owner = dispatcher_id()
        self.http = httpx.AsyncClient(
            timeout=pacing.timeout_s, follow_redirects=False, trust_env=False
        )
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Take the leases that are free now (which starts each new webhook's cursor
        at the journal's end before the gateway serves), then deliver in the background."""
        for tenant in self._webhook_tenants():
            with contextlib.suppress(LedgerError):
                await self.ledger.webhook_lease(
                    tenant, self.owner, "hold", str(self.pacing.lease_ms)
                )
        self.refresh()

    def refresh(self) -> None:
        """A task for every tenant that has a webhook now (a reload may add one)."""
        for tenant in self._webhook_tenants():
            task = self.tasks.get(tenant)
            if task is None or task.done():
                self.tasks[tenant] = asyncio.create_task(self._serve(tenant))

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):  # one tenant's failure stops no release
            await stop_tasks(self.tasks.values())
        released = False
        for tenant in self.tasks:
            # Another process takes over at once, rather than when the lease runs out
            # and it next asks: the announcement makes it ask now.
            with contextlib.suppress(Exception):
                ours, _ = await self.ledger.webhook_lease(tenant, self.owner, "release")
                released = released or ours
        if released:
            with contextlib.suppress(LedgerError):
                await self.ledger.policies.announce("lease")
        await self.http.aclose()

    def _webhook_tenants(self) -> list[str]:
        return sorted(t for t, p in self.tenants.policies.items() if p.document.webhook)

    def _policy(self, tenant: str) -> TenantPolicy | None:
        policy = self.tenants.policies.get(tenant)
        return policy if policy is not None and policy.document.webhook is not None else None

    async def _serve(self, tenant: str) -> None:
        """Deliver while this process holds the tenant's lease. One that does not asks
        again only when told a lease may be free ('lease' on the change feed: another
        process gave its leases up, or the fleet's watcher found this one lapsed,
        gateway/state/fleetwatch.py), so idle dispatchers cost Redis nothing whatever their
        number; while no watcher beats, after about a lease's length (jittered)."""
        next_ask = 0.0
        lost = False
        heard = self._heard()
        while self._policy(tenant) is not None:
            if self._heard() != heard:
                heard, next_ask, lost = self._heard(), 0.0, False
            busy = False
            if time.monotonic() >= next_ask and not (lost and self._watched()):
                try:
                    held, cursor = await self._hold(tenant)
                    lost = not held
                    if not held:
                        next_ask = time.monotonic() + self._ask_s()
                    busy = held and await self._pump(tenant, cursor)
                    self._ledger_back()
                except LedgerUnavailable as exc:
                    self._ledger_lost(exc)
                except Exception:
                    log.exception("webhook dispatcher failed", extra={"tenant": tenant})
            if not busy:
                await asyncio.sleep(self.pacing.poll_s)
        with contextlib.suppress(Exception):
            await self.ledger.webhook_lease(tenant, self.owner, "release")

    def _heard(self) -> int:
        return self.feed.heard("lease") if self.feed is not None else 0

    def _watched(self) -> bool:
        return self.feed is not None and self.feed.watched

    def _ask_s(self) -> float:
        return max(self.pacing.lease_ms / 1000, self.pacing.poll_s) * random.uniform(0.5, 1.0)

    def _ledger_lost(self, exc: LedgerUnavailable) -> None:
        """Say once per outage that Redis is out of reach (every tenant's task keeps
        trying each poll; a line per try was a line every 0.5 s for the outage)."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning(
                "webhook dispatcher: ledger unavailable; delivery resumes when it is back",
                extra={"why": str(exc)},
            )

    def _ledger_back(self) -> None:
        if self._down_since is not None:
            down_s = round(time.monotonic() - self._down_since, 1)
            self._down_since = None
            log.info("webhook dispatcher: ledger back", extra={"down_s": down_s})

    async def _hold(self, tenant: str) -> tuple[bool, str]:
        return await self.ledger.webhook_lease(
            tenant, self.owner, "hold", str(self.pacing.lease_ms)
        )

    async def _pump(self, tenant: str, cursor: str) -> bool:
        """Deliver the events of one journal page after `cursor`, fairly across agents
        (`fair_order`); False if there was nothing to read. The cursor moves past every
        entry whose events, and those of every entry before it, were delivered, and
        past the page's other entries at its end."""
        page = await read_journal(self.ledger, tenant, after=cursor, count=PAGE)
        if not page:
            return False
        policy = self._policy(tenant)
        if policy is None:
            return True
        events = [
            (at, event)
            for at, entry in enumerate(page)
            for event in await events_of(self.ledger, policy, [entry])
        ]
        undelivered = Counter(at for at, _ in events)
        moved_to = -1
        for at, event in fair_order(events):
            if not await self._deliver(tenant, event):
                return True  # the lease is gone, or the webhook
            undelivered[at] -= 1
            done = moved_to
            while done + 1 < len(page) and undelivered[done + 1] == 0:
                done += 1
            if done > moved_to:
                moved, _ = await self.ledger.webhook_lease(
                    tenant, self.owner, "advance", page[done].entry_id
                )
                if not moved:
                    return True
                moved_to = done
        await self.ledger.webhook_lease(tenant, self.owner, "advance", page[-1].entry_id)
        return True

    async def _deliver(self, tenant: str, event: dict[str, Any]) -> bool:
        """POST one event until the receiver takes it; False if this dispatcher lost
        the lease (or the tenant its webhook) meanwhile: then it must not send."""
        body = json.dumps(event, separators=(",", ":"), sort_keys=True).encode()
        attempt = 0
        while True:
            attempt += 1
            policy = self._policy(tenant)
            held, _ = await self._hold(tenant)
            if policy is None or not held or policy.document.webhook is None:
                return False
            why = await self._attempt(policy, policy.document.webhook.url, event, body, attempt)
            if not why:
                metrics.WEBHOOK_DELIVERIES.labels(tenant, "delivered").inc()
                log.info(
                    "webhook delivered",
                    extra={
                        "tenant": tenant,
                        "event": event["id"],
                        "type": event["type"],
                        "attempt": attempt,
                    },
                )
                return True
            metrics.WEBHOOK_DELIVERIES.labels(tenant, "failed").inc()
            delay = self.pacing.backoff(attempt)
            log.warning(
                "webhook delivery failed",
                extra={
                    "tenant": tenant,
                    "event": event["id"],
                    "attempt": attempt,
                    "why": why,
                    "retry_in_s": round(delay, 3),
                },
            )
            await asyncio.sleep(delay)

    async def _attempt(
        self, policy: TenantPolicy, url: str, event: dict[str, Any], body: bytes, attempt: int
    ) -> str:
        """One POST: '' if the receiver took it, else why not (never the secret)."""
        try:
            secret = webhook_secret(policy)
        except PolicyError as exc:
            return str(exc).replace("\n", "; ")
        assert secret is not None
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(secret, int(time.time()), body),
            "Irrev-Event-Id": event["id"],
            "Irrev-Event-Type": event["type"],
            "Irrev-Delivery-Attempt": str(attempt),
        }
        try:
            async with asyncio.timeout(self.pacing.deadline_s):
                async with self.http.stream("POST", url, content=body, headers=headers) as answer:
                    await _skim(answer)
        except TimeoutError:
            return f"no whole answer within {self.pacing.deadline_s:g} s"
        except httpx.HTTPError as exc:
            return type(exc).__name__
        if 200 <= answer.status_code < 300:
            return ""
        return f"status {answer.status_code}"


def fair_order(events: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """A page's events one agent at a time, round robin, each agent's in journal order
    (so a hold's events keep theirs): one agent's flood of escalations delays another
    agent's event by at most one event of its own in a page, not by the whole flood.
    Events of no agent (rules) take a turn of their own."""
    lanes: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
    for item in events:
        lanes.setdefault(str(item[1].get("agent") or ""), deque()).append(item)
    ordered = []
    while lanes:
        for agent in list(lanes):
            ordered.append(lanes[agent].popleft())
            if not lanes[agent]:
                del lanes[agent]
    return ordered


async def _skim(answer: httpx.Response) -> None:
    """Read up to ANSWER_BYTES of the answer and drop them: only its status counts.
    A short answer read to its end keeps the connection for the next event; a longer
    one is left unread and its connection closed (read whole, a receiver answering
    300 MiB grew the worker by 440 MB)."""
    read = 0
    async for chunk in answer.aiter_raw():
        read += len(chunk)
        if read >= ANSWER_BYTES:
            return
