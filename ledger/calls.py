"""How the ledger runs its Lua: FCALL of its Functions library where the server has
Redis Functions (7+), EVALSHA of one script per operation where it does not (6.2),
and on a Redis Cluster straight to the primary of the tenant's slot.

The library is loaded with FUNCTION LOAD REPLACE, on every primary of a cluster.
Redis keeps it in its data, so a restart or a failover keeps it; a node that answers
that it lacks the function (a new primary, a FUNCTION FLUSH) or the script (a
restart of 6.2, which forgets scripts) is loaded again and the call sent once more.

On a cluster, calls bypass redis-py's routing of FCALL, which asks the server for a
command's keys (COMMAND GETKEYS: one more round trip per call): every key of a call
carries one tenant's hash tag, so the first key names the slot.

On a standalone Redis, a single call goes past redis-py's per-call layers (pool
checkout, retry and observability wrappers, a task per send) on a connection kept
between calls (ledger/connect.py's DirectCalls): at 1 client those layers cost more
than a reserve's own time in Redis. Batches and script-then-WAIT use redis-py's
pipelines, whose layers are paid once per round trip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors

from .cluster import MIGRATION_WAIT_S, REDIRECTED
from .connect import direct_calls
from .scripts import GROUP_OPERATIONS, OPERATIONS, function_library, script_source
from .topology import Topology


class Scripts:
    """The ledger's operations on one client (of `topology`): `call` runs one,
    `call_many` a batch, `call_then_wait` one followed by WAIT (or WAITAOF) on the
    same connection."""

    def __init__(self, topology: Topology, migration_wait_s: float = MIGRATION_WAIT_S) -> None:
        self.topology = topology
        self.redis = topology.redis
        self.migration_wait_s = migration_wait_s
        self.direct = direct_calls(self.redis)
        self.library = function_library()
        self.sources = {
            operation: script_source(operation) for operation in (*OPERATIONS, *GROUP_OPERATIONS)
        }
        self.shas = {
            operation: hashlib.sha1(source.encode()).hexdigest()
            for operation, source in self.sources.items()
        }
        # operation -> (command, function name or script SHA): unset until the first
        # load tells whether the server has Functions.
        self.heads: dict[str, tuple[str, str]] = {}

    @property
    def functions(self) -> bool:
        return bool(self.heads) and self.heads[OPERATIONS[0]][0] == "FCALL"

    async def load(self) -> None:
        """Load the library (every primary of a cluster), or on a server without
        Functions every script."""
        try:
            await self.redis.function_load(self.library.code, replace=True)
        except redis_errors.ResponseError as exc:
            if "unknown command" not in str(exc).lower():
                raise
            for source in self.sources.values():
                await self.redis.script_load(source)
            self.heads = {op: ("EVALSHA", sha) for op, sha in self.shas.items()}
        else:
            self.heads = {op: ("FCALL", name) for op, name in self.library.functions.items()}

    async def loaded(self) -> bool:
        """Whether the server still has what `call` runs (it is loaded again when
        found missing, so this is for health checks)."""
        if not self.heads:
            return False
        if self.functions:
            found = await self.redis.function_list(library=self.library.name)
            # A cluster client asks every primary: {node: its libraries}.
            return all(found.values()) if isinstance(found, dict) else bool(found)
        return all(await self.redis.script_exists(*self.shas.values()))

    def _head(self, operation: str, keys: list[str], args: list[str]) -> tuple[Any, ...]:
        command, target = self.heads[operation]
        return (command, target, len(keys), *keys, *args)

    async def call(self, operation: str, keys: list[str], args: list[str]) -> Any:
        if not self.heads:
            await self.load()
        try:
            return await self.send(self._head(operation, keys, args), keys[0])
        except redis_errors.ResponseError as exc:
            if not _missing(exc):
                raise
        await self.load()
        return await self.send(self._head(operation, keys, args), keys[0])

    async def send(self, command: tuple[Any, ...], key: str) -> Any:
        """One command the way the ledger sends its scripts (`key`: one of its keys):
        on a standalone client by DirectCalls, past redis-py's per-call layers, unless
        the client is traced (OpenTelemetry wraps execute_command, whose spans would
        be lost); on a cluster to the primary of `key`'s slot."""
        if self.direct is not None and not hasattr(self.redis.execute_command, "__wrapped__"):
            return await self.direct.call(command)
        return await self.topology.send(command, key, wait_s=self.migration_wait_s)

    async def release(self) -> None:
        """Give connections kept for calls back to the client's pool."""
        if self.direct is not None:
            await self.direct.release()

    async def call_then_wait(
        self,
        operation: str,
        keys: list[str],
        args: list[str],
        waits: Sequence[tuple[Any, ...]],
    ) -> tuple[Any, list[Any]]:
        """The call, then `waits` (WAIT, WAITAOF, with their arguments) on the same
        connection: each counts what happened to every write of its connection
        (replicas that received it; with WAITAOF, fsyncs of the AOF). Returns (reply or
        error, each wait's answer or error)."""
        if not self.heads:
            await self.load()
        for attempt in range(2):
            commands = [self._head(operation, keys, args), *waits]
            reply, *acked = await self.topology.pipeline(
                keys[0], commands, wait_s=self.migration_wait_s
            )
            if attempt == 0 and isinstance(reply, redis_errors.ResponseError) and _missing(reply):
                await self.load()
                continue
            break
        return reply, acked

    async def call_many(
        self,
        operation: str,
        batch: list[tuple[list[str], list[str]]],
        waits: Sequence[tuple[Any, ...]] = (),
    ) -> list[tuple[Any, list[Any]]]:
        """(keys, args) of each call, in one pipeline (on a cluster, the batch is one
        tenant's: one slot, one primary), then `waits` on the same connection: each
        call's reply or error in place, with the answers of the waits that followed it
        (a wait counts every write of its connection so far, so one after the batch
        covers all of it). Calls that were redirected (a slot on the move) are sent
        again one by one, each followed by its own waits."""
        if not batch:
            return []
        if not self.heads:
            await self.load()
        key = batch[0][0][0]
        commands = [self._head(operation, keys, args) for keys, args in batch]
        replies, answers = await self.pipeline(commands, key, waits)
        done = [(reply, answers) for reply in replies]
        todo = [i for i, r in enumerate(replies) if isinstance(r, Exception) and _missing(r)]
        if todo:
            # Those did not run; the others did and are not sent again.
            await self.load()
            commands = [self._head(operation, *batch[i]) for i in todo]
            again, answers = await self.pipeline(commands, key, waits)
            for i, reply in zip(todo, again, strict=True):
                done[i] = (reply, answers)
        for i, (reply, _) in enumerate(done):
            if isinstance(reply, (*REDIRECTED, redis_errors.ClusterError)):
                keys, args = batch[i]
                try:
                    done[i] = await self.call_then_wait(operation, keys, args, waits)
                except redis_errors.RedisError as exc:
                    done[i] = (exc, [])
        return done

    async def call_group(
        self,
        operation: str,
        standard: int,
        batch: list[tuple[list[str], list[str]]],
        waits: Sequence[tuple[Any, ...]] = (),
    ) -> list[tuple[Any, list[Any]]]:
        """`call_many`'s batch as one call of `<operation>_group` (one tenant's calls,
        whose first `standard` keys are the same: sent once), then `waits`: what
        `call_many` returns. Redis pays its fixed cost per command once for the group.
        A group that did not run (redirected: its slot on the move) goes as
        `call_many`'s pipeline; one that failed fails every call of it (an error reply
        in place), or raises as `call_many` does when Redis could not be reached."""
        if len(batch) < 2:
            return await self.call_many(operation, batch, waits)
        keys = [*batch[0][0][:standard]]
        counts: list[str] = []
        args: list[str] = []
        for call_keys, call_args in batch:
            keys += call_keys[standard:]
            counts += (str(len(call_keys) - standard), str(len(call_args)))
            args += call_args
        group = f"{operation}_group"
        sent = [str(len(batch)), *counts, *args]
        if waits:
            reply, answers = await self.call_then_wait(group, keys, sent, waits)
        else:
            try:
                reply, answers = await self.call(group, keys, sent), []
            except (*REDIRECTED, redis_errors.ClusterError):
                return await self.call_many(operation, batch, waits)
        if isinstance(reply, (*REDIRECTED, redis_errors.ClusterError)):
            return await self.call_many(operation, batch, waits)
        if isinstance(reply, Exception):
            return [(reply, answers) for _ in batch]
        return [(item, answers) for item in reply]

    async def pipeline(
        self, commands: list[tuple[Any, ...]], key: str, waits: Sequence[tuple[Any, ...]]
    ) -> tuple[list[Any], list[Any]]:
        """The replies of `commands` (at least one), and the answers of `waits` sent
        after them."""
        sent = [*commands, *waits]
        replies = await self.topology.pipeline(key, sent, watch=None, wait_s=self.migration_wait_s)
        return replies[: len(commands)], replies[len(commands) :]


def _missing(exc: Exception) -> bool:
    """Redis lacks the function or script (restarted 6.2, a new or flushed node)."""
    return isinstance(exc, redis_errors.NoScriptError) or "Function not found" in str(exc)
