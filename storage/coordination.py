"""Who does what when several bot processes share one PostgreSQL database.

Why session-level advisory locks on one dedicated connection per process: a lock held by
a session lives exactly as long as its connection, so a process that dies (kill -9, a
lost host) frees everything it held the moment PostgreSQL notices the connection gone,
without leases to expire or a lock server to run. One connection carries every lock of
the process (a community's learning, a scheduled job's run), so holding locks for many
communities costs no pool connections; each lock or unlock is one short statement.

Locks are counted in the process: a second holder in the same process (the learner and
a moderator's rollback of one community, serialised by the agent's own lock) shares the
server-side lock, which is released when the last holder lets go.

If the connection breaks, every lock it held is gone: holders are not told, but every
commit still checks in its own transaction that it creates exactly the next version and
acknowledges a row still pending (`CommunityStore.commit`), so a second learner can
waste work but never apply an interaction twice or out of order.

On SQLite there is one process per data directory (the lock file), so `Database`
carries no coordinator: a scheduled job always runs, and a community's learning lease is
a `sonality.store.LocalLease` held in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from storage.base import first_line
from storage.models import StorageError
from storage.postgres import CONNECT_TIMEOUT_S, describe_url

log = logging.getLogger(__name__)

LOCK_SPACE = 0x534F4C4B
"""The first key of every coordination lock (the second is the name's hash): distinct
from the write-scope locks (`storage.base.SCOPE_LOCKS`) and the migration lock."""

LEARNING = "learn:"
JOB = "job:"
EPISODES = "episodes:"


class Coordinator:
    """Named, try-only, session-level advisory locks on one connection of their own."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.where = describe_url(url)
        self._conn: Any = None  # psycopg.AsyncConnection, opened on first use
        self._lock = asyncio.Lock()  # one statement at a time on the connection
        self._held: dict[str, int] = {}
        self._closed = False

    async def _connection(self) -> Any:
        import psycopg

        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if self._held:
            log.warning(
                "the coordination connection to %s was lost; %d lock(s) went with it",
                self.where,
                len(self._held),
            )
            self._held.clear()
        try:
            self._conn = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            )
        except psycopg.Error as exc:
            raise StorageError(f"PostgreSQL at {self.where}: {first_line(exc)}") from None
        return self._conn

    async def try_lock(self, name: str) -> bool:
        """Take the lock `name` if no other process holds it; never waits."""
        if self._closed:
            return False
        async with self._lock:
            if self._held.get(name) and await self._alive():
                self._held[name] += 1
                return True
            try:
                conn = await self._connection()
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(%s::integer, hashtext(%s))", (LOCK_SPACE, name)
                )
                row = await cur.fetchone()
            except Exception as exc:
                # Not granted: the work waits for the next try (a message, the sweep).
                log.warning("could not ask for the lock %s (%s)", name, first_line(exc))
                return False
            if not row or not row[0]:
                return False
            self._held[name] = 1
            return True

    async def _alive(self) -> bool:
        """Whether the connection (and so every lock counted as held) is still there:
        one empty round trip. A lost one forgets its locks (see `_connection`)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            await conn.execute("SELECT 1")
        except Exception as exc:
            log.warning(
                "the coordination connection to %s failed (%s)", self.where, first_line(exc)
            )
            return False
        return True

    async def unlock(self, name: str) -> None:
        async with self._lock:
            count = self._held.get(name, 0)
            if count > 1:
                self._held[name] = count - 1
                return
            if count == 0:
                return  # lost with a broken connection: nothing left to release
            del self._held[name]
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                return
            try:
                await conn.execute(
                    "SELECT pg_advisory_unlock(%s::integer, hashtext(%s))", (LOCK_SPACE, name)
                )
            except Exception as exc:
                log.warning("could not release the lock %s (%s)", name, first_line(exc))

    @contextlib.asynccontextmanager
    async def job(self, name: str) -> AsyncIterator[bool]:
        """Yield True when this process runs this run of the job `name` (others skip)."""
        got = await self.try_lock(JOB + name)
        try:
            yield got
        finally:
            if got:
                await self.unlock(JOB + name)

    async def close(self) -> None:
        self._closed = True
        async with self._lock:
            self._held.clear()
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
                self._conn = None


class LearningLease:
    """One community's learning lease (`sonality.store.LearningLease`) on PostgreSQL."""

    shared = True

    def __init__(self, coordinator: Coordinator, community_id: str) -> None:
        self._coordinator = coordinator
        self._name = LEARNING + community_id

    async def acquire(self) -> bool:
        return await self._coordinator.try_lock(self._name)

    async def release(self) -> None:
        await self._coordinator.unlock(self._name)
