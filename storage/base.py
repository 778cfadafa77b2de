"""The one SQLite connection, how a transaction reaches it, and the shared value codecs.

Why every operation is ONE call into aiosqlite's worker thread: aiosqlite runs each call
of a connection on one worker thread, and every awaited call (BEGIN, each statement, each
fetch, COMMIT) costs a trip through the event loop. Under load the loop is busy with
HTTP work, so a transaction made of many awaited calls stays open for many loop
iterations and every other DB operation queues behind it (measured: ~1.3 s p50 for
operations SQLite finishes in ~1 ms). So each storage method builds its statements in a
plain synchronous function of a `sqlite3.Connection`, and `SqlBase._run_write` /
`_run_read` hand that function to the worker thread in one call that also does
BEGIN ... COMMIT/ROLLBACK around it.

Why that is atomic without an `asyncio.Lock`: the worker thread runs queued calls one at
a time, and each call opens and closes its own transaction, so no other operation can
run in the middle of one (and no read can see another operation's uncommitted rows).

What this does not remove: between SQLite calls the worker thread needs the GIL, and an
event loop that never idles can starve it of the GIL (CPython hands it back to the loop
thread on each loop iteration, faster than the waiting thread wakes up). Running the
same `fn` on the loop thread would avoid that; `run_on_sqlite_thread` is the one place
to change if measurements call for it.

Timestamps are stored as ISO-8601 UTC text with fixed microsecond precision
(``2025-01-31T04:00:00.000000+00:00``): readable in the sqlite3 shell and, because the
width is fixed, string comparison in SQL equals chronological order.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable
from datetime import UTC, date, datetime, tzinfo
from typing import Any, Literal, TypeVar

import aiosqlite
import pydantic_core

from sonality.llm import Usage
from storage.models import StorageError, usage_role

Row = tuple[Any, ...]
T = TypeVar("T")


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


# --- running work on the SQLite thread -------------------------------------------------


async def run_on_sqlite_thread(
    conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]
) -> T:
    """Run `fn(sqlite3_connection)` in aiosqlite's worker thread: ONE round trip.

    aiosqlite has no public "run this callable in your thread" API; `Connection._execute`
    is the mechanism every public aiosqlite method is built on (pinned: aiosqlite 0.22.x
    in pyproject.toml), and this is the only place storage uses it.

    Cancellation: `_execute` queues the call before it first suspends, so once the
    awaiting task got that far, the call runs to completion in the worker thread even
    if the task is cancelled; only its result is dropped. Together with
    `write_transaction` this means a cancelled write is applied entirely or not at all.
    """
    result: T = await conn._execute(fn, conn._conn)
    return result


def write_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``BEGIN IMMEDIATE``, `fn`, ``COMMIT``; ``ROLLBACK`` if anything raises, COMMIT included.

    IMMEDIATE takes SQLite's write lock up front, so another process sharing the file
    waits (busy_timeout) at BEGIN instead of failing halfway through.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
        conn.commit()
    except BaseException:
        conn.rollback()  # a no-op if SQLite already ended the transaction
        raise
    return result


def read_snapshot(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run `fn` in a deferred transaction, so all its queries see one consistent state."""
    conn.execute("BEGIN")
    try:
        return fn(conn)
    finally:
        conn.rollback()


class SqlBase:
    """The connection + transaction helpers; package-internal (only `storage` speaks SQL)."""

    def __init__(self, conn: aiosqlite.Connection, tz: tzinfo = UTC) -> None:
        self._conn = conn
        # The zone whose calendar days token usage is summed by (SONALITY_TIMEZONE):
        # spending limits and `/sonality usage` speak of the community's "today".
        self.tz = tz
        # Only `close` uses it (a second close waits for the first); transactions need no
        # lock, see the module docstring.
        self._close_lock = asyncio.Lock()
        self._closed = False

    async def _run_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` as one write transaction (all or nothing) in one round trip.

        `fn` is synchronous and must do all its work on the connection it is given; it
        runs in the SQLite thread between ``BEGIN IMMEDIATE`` and ``COMMIT`` (``ROLLBACK``
        on any exception, which is then raised here). No other storage operation runs
        while it does. If the caller is cancelled after the call was queued, the
        transaction still completes or rolls back entirely; it is never half-applied.
        """
        self._ensure_open()
        return await run_on_sqlite_thread(self._conn, lambda c: write_transaction(c, fn))

    async def _run_read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn`'s queries in one round trip, as one consistent snapshot (then ROLLBACK)."""
        self._ensure_open()
        return await run_on_sqlite_thread(self._conn, lambda c: read_snapshot(c, fn))

    async def _fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        args = tuple(params)
        return await self._run_read(lambda c: fetchall(c, sql, args))

    async def _fetchone(self, sql: str, params: Iterable[Any] = ()) -> Row | None:
        args = tuple(params)
        return await self._run_read(lambda c: fetchone(c, sql, args))

    def _ensure_open(self) -> None:
        if self._closed:
            raise StorageError("the database is closed")


# --- synchronous statement helpers (called inside a `_run_write` / `_run_read` fn) -------


def fetchall(conn: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> list[Row]:
    cur = conn.execute(sql, tuple(params))
    try:
        return [tuple(row) for row in cur.fetchall()]
    finally:
        cur.close()


def fetchone(conn: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> Row | None:
    """The first row (the statement is finished either way, e.g. an UPDATE ... RETURNING)."""
    cur = conn.execute(sql, tuple(params))
    try:
        row = cur.fetchone()
    finally:
        cur.close()
    return None if row is None else tuple(row)


def execute(conn: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> int:
    """Run one statement; returns the number of rows it changed."""
    cur = conn.execute(sql, tuple(params))
    try:
        return cur.rowcount
    finally:
        cur.close()


def ensure_community(conn: sqlite3.Connection, community_id: str, at: datetime) -> None:
    """Create the community row if missing (every per-community row references it)."""
    if not community_id:
        raise StorageError("community_id must not be empty")
    execute(
        conn,
        "INSERT OR IGNORE INTO communities (id, platform, name, created_at) VALUES (?, ?, '', ?)",
        (community_id, platform_of(community_id), to_db_time(at)),
    )


def advance_time(
    conn: sqlite3.Connection,
    community_id: str,
    column: Literal["last_activity_at", "last_reflection_time"],
    at: datetime,
) -> None:
    """Move one of a community's times forward to `at`, creating its row if missing.

    Never backwards: a late writer can't hide newer activity or a newer reflection.
    """
    ensure_community(conn, community_id, at)
    stamp = to_db_time(at)
    execute(
        conn,
        f"UPDATE communities SET {column} = ? WHERE id = ? AND ({column} IS NULL OR {column} < ?)",
        (stamp, community_id, stamp),
    )


def local_day(at: datetime, tz: tzinfo) -> date:
    """The calendar day `at` falls on in `tz` (naive values are taken to be UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(tz).date()


def insert_usage(
    conn: sqlite3.Connection,
    community_id: str,
    purpose: str,
    model: str,
    usage: Usage,
    at: datetime,
    tz: tzinfo,
) -> None:
    """Add one LLM call to its (community, local day, role, model) row of `usage_daily`.

    Why a rollup and not a row per call: a busy community makes thousands of calls a
    day, and every reader (status, spending limits, `/sonality usage`) wants sums per
    day anyway; one row per day, role and model keeps the table bounded by time.
    """
    execute(
        conn,
        "INSERT INTO usage_daily (community_id, day, role, model, calls, input_tokens, "
        "output_tokens, cache_write_tokens, cache_read_tokens) "
        "VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?) "
        "ON CONFLICT (community_id, day, role, model) DO UPDATE SET "
        "calls = calls + 1, "
        "input_tokens = input_tokens + excluded.input_tokens, "
        "output_tokens = output_tokens + excluded.output_tokens, "
        "cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens, "
        "cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens",
        (
            community_id,
            local_day(at, tz).isoformat(),
            usage_role(purpose),
            model,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_write_tokens,
            usage.cache_read_tokens,
        ),
    )
