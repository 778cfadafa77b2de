"""The one SQLite connection, its lock, and the value codecs every storage module shares.

Why one connection guarded by one `asyncio.Lock` for reads *and* writes: aiosqlite runs
every call of a connection on one worker thread, so a second task reading through the
same connection in the middle of another task's transaction would see that
transaction's uncommitted rows (and could act on a version that is then rolled back).
Holding the lock for the whole transaction makes every read see committed data only and
keeps each group of writes that belong together in exactly one transaction. Statements
are short, so the lost parallelism is negligible next to LLM latency.

Timestamps are stored as ISO-8601 UTC text with fixed microsecond precision
(``2025-01-31T04:00:00.000000+00:00``): readable in the sqlite3 shell and, because the
width is fixed, string comparison in SQL equals chronological order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import aiosqlite
import pydantic_core

from sonality.llm import Usage
from storage.models import StorageError

Row = tuple[Any, ...]


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_db_time(value: datetime) -> str:
    """Encode a datetime for storage; naive values are taken to be UTC already."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def from_db_time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def to_json(value: Any) -> str:
    """JSON for payload columns; datetimes/models become their JSON form instead of failing."""
    return pydantic_core.to_json(value).decode("utf-8")


def from_json(value: str) -> Any:
    return pydantic_core.from_json(value)


def platform_of(community_id: str) -> str:
    """ "discord:123" -> "discord"; ids without a namespace get an empty platform."""
    prefix, sep, _ = community_id.partition(":")
    return prefix if sep else ""


class SqlBase:
    """Connection + lock + transaction helpers; package-internal (only `storage` speaks SQL)."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()
        self._closed = False

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): all or nothing, writers serialised.

        IMMEDIATE takes SQLite's write lock up front, so another process sharing the file
        waits (busy_timeout) at BEGIN instead of failing halfway through.
        """
        async with self._lock:
            self._ensure_open()
            try:
                # BEGIN is inside the try: if the task is cancelled while BEGIN is queued,
                # the worker thread still runs it, and the ROLLBACK queued behind it must
                # close that transaction again. The same holds for any statement of the
                # body, so nothing half-done is ever left open or applied. (Cancelled
                # while COMMIT is queued, the write is applied in full although the
                # caller sees CancelledError.)
                await execute(self._conn, "BEGIN IMMEDIATE")
                yield self._conn
                await self._conn.commit()
            except BaseException:
                await self._conn.rollback()
                raise

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[aiosqlite.Connection]:
        """A consistent read snapshot (deferred transaction) that never sees half a write."""
        async with self._lock:
            self._ensure_open()
            try:
                await execute(self._conn, "BEGIN")
                yield self._conn
            finally:
                await self._conn.rollback()

    async def _fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        async with self._read() as conn:
            return await fetchall(conn, sql, params)

    async def _fetchone(self, sql: str, params: Iterable[Any] = ()) -> Row | None:
        async with self._read() as conn:
            return await fetchone(conn, sql, params)

    def _ensure_open(self) -> None:
        if self._closed:
            raise StorageError("the database is closed")


async def fetchall(conn: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> list[Row]:
    async with conn.execute(sql, tuple(params)) as cur:
        return [tuple(row) for row in await cur.fetchall()]


async def fetchone(conn: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> Row | None:
    async with conn.execute(sql, tuple(params)) as cur:
        row = await cur.fetchone()
    return None if row is None else tuple(row)


async def execute(conn: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> int:
    """Run one statement; returns the number of rows it changed."""
    async with conn.execute(sql, tuple(params)) as cur:
        return cur.rowcount


async def ensure_community(conn: aiosqlite.Connection, community_id: str, at: datetime) -> None:
    """Create the community row if missing (every per-community row references it)."""
    if not community_id:
        raise StorageError("community_id must not be empty")
    await execute(
        conn,
        "INSERT OR IGNORE INTO communities (id, platform, name, created_at) VALUES (?, ?, '', ?)",
        (community_id, platform_of(community_id), to_db_time(at)),
    )


async def note_activity(conn: aiosqlite.Connection, community_id: str, at: datetime) -> None:
    """Move last_activity_at forward (never backwards: late writers can't hide activity)."""
    await ensure_community(conn, community_id, at)
    stamp = to_db_time(at)
    await execute(
        conn,
        "UPDATE communities SET last_activity_at = ? WHERE id = ? "
        "AND (last_activity_at IS NULL OR last_activity_at < ?)",
        (stamp, community_id, stamp),
    )


async def insert_usage(
    conn: aiosqlite.Connection,
    community_id: str,
    purpose: str,
    model: str,
    usage: Usage,
    at: datetime,
) -> None:
    await execute(
        conn,
        "INSERT INTO token_usage (community_id, purpose, model, input_tokens, output_tokens, "
        "cache_read_tokens, cache_write_tokens, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            community_id,
            purpose,
            model,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            to_db_time(at),
        ),
    )
