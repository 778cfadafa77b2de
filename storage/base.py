"""How a storage operation reaches the database, on either engine, and the shared codecs.

Two engines sit behind one design. Every storage method builds its statements in a
plain synchronous function ``fn(conn)`` of a `Conn` and hands it over in ONE call,
which also opens and ends the transaction around it:

- SQLite (the default): the call goes to aiosqlite's worker thread. Every awaited call
  (BEGIN, each statement, each fetch, COMMIT) would cost a trip through the event loop;
  under load the loop is busy with HTTP work, so a transaction made of many awaited
  calls stays open for many loop iterations and every other DB operation queues behind
  it (measured: ~1.3 s p50 for operations SQLite finishes in ~1 ms). The worker thread
  runs queued calls one at a time, each its own transaction, so no other operation runs
  in the middle of one and no read sees another's uncommitted rows, without any lock.
- PostgreSQL (``DATABASE_URL``): the call goes to a thread of the engine's own that
  borrows a connection from a psycopg pool for the whole transaction: again one thread
  hop per operation, and the ~3,600 lines of storage logic are written once. Here
  transactions DO run concurrently (several connections, later several processes), so
  each write first takes a transaction lock on its scope (its community, or one lock
  for everything else) and is re-run on a deadlock; reads run in one REPEATABLE READ,
  READ ONLY snapshot (see `PostgresEngine`).

The contract every ``fn`` keeps, and what makes re-running it safe: it does all its work
through the `Conn` it is given (no other I/O, no changes to outside state that a second
run would repeat), and it may be called more than once for one operation; only the
transaction of the last call is committed.

SQL text is written once where both engines accept it (``ON CONFLICT ... DO NOTHING``,
``RETURNING``, ``excluded.``); ``?`` placeholders are turned into psycopg's ``%s`` by
`to_postgres`, and the few SQLite functions PostgreSQL lacks (JSON paths, ``instr``)
are built by the `Dialect` of the connection.

Timestamps are stored as ISO-8601 UTC text with fixed microsecond precision
(``2025-01-31T04:00:00.000000+00:00``): readable in any SQL shell and, because the width
is fixed, string comparison in SQL equals chronological order (PostgreSQL's text
columns use the "C" collation so that holds there too).

What this does not remove on SQLite: between calls the worker thread needs the GIL, and
an event loop that never idles can starve it of the GIL (CPython hands it back to the
loop thread on each loop iteration, faster than the waiting thread wakes up). Running
the same ``fn`` on the loop thread would avoid that; `run_on_sqlite_thread` is the one
place to change if measurements call for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, tzinfo
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import aiosqlite
import pydantic_core

from sonality.llm import Usage
from storage.models import IntegrityViolation, StorageError, usage_role

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

Row = tuple[Any, ...]
T = TypeVar("T")
EngineName = Literal["sqlite", "postgresql"]


def to_db_time(value: datetime) -> str:
    """Encode a datetime for storage; naive values are taken to be UTC already."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def from_db_time(value: str) -> datetime:
    return datetime.fromisoformat(value)


_JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
"""A JSON escape of NUL (an odd run of backslashes before u0000, so not an escaped
backslash followed by the letters)."""


def to_json(value: Any) -> str:
    """JSON for payload columns; datetimes/models become their JSON form instead of failing."""
    return pydantic_core.to_json(value).decode("utf-8")


def from_json(value: str) -> Any:
    return pydantic_core.from_json(value)


def platform_of(community_id: str) -> str:
    """ "discord:123" -> "discord"; ids without a namespace get an empty platform."""
    prefix, sep, _ = community_id.partition(":")
    return prefix if sep else ""


# --- the two dialects ------------------------------------------------------------------


class Dialect:
    """The SQL fragments that differ between the engines; everything else is shared text.

    JSON columns are TEXT on both engines (the exact text is what was written, which the
    keyframe chain and the forget-me redaction rely on); PostgreSQL reads into them with
    a ``::jsonb`` cast. Paths are dotted keys ("ess.summary").
    """

    def __init__(self, name: EngineName) -> None:
        self.name = name

    @property
    def postgres(self) -> bool:
        return self.name == "postgresql"

    def json_text(self, column: str, path: str) -> str:
        """The value at `path` as SQL text (a JSON string's contents, or the JSON of an
        array/object); NULL when missing."""
        if self.postgres:
            return f"({column}::jsonb #>> '{{{path.replace('.', ',')}}}')"
        return f"json_extract({column}, '$.{path}')"

    def json_is_true(self, column: str, path: str) -> str:
        if self.postgres:
            return f"({column}::jsonb #> '{{{path.replace('.', ',')}}}') = 'true'::jsonb"
        return f"json_extract({column}, '$.{path}') = 1"

    def json_array_not_empty(self, column: str, path: str) -> str:
        if self.postgres:
            value = f"({column}::jsonb #> '{{{path.replace('.', ',')}}}')"
            return (
                f"(CASE WHEN jsonb_typeof({value}) = 'array' "
                f"THEN jsonb_array_length({value}) ELSE 0 END) > 0"
            )
        return f"json_array_length({column}, '$.{path}') > 0"

    def json_blank(self, column: str, *paths: str) -> str:
        """`column` with each of `paths` set to the empty string."""
        if self.postgres:
            expr = f"{column}::jsonb"
            for path in paths:
                expr = f"jsonb_set({expr}, '{{{path.replace('.', ',')}}}', '\"\"'::jsonb)"
            return f"({expr})::text"
        settings = ", ".join(f"'$.{path}', ''" for path in paths)
        return f"json_set({column}, {settings})"

    def contains(self, haystack: str, needle: str = "?") -> str:
        """True when the text `needle` occurs in `haystack` (both SQL expressions)."""
        if self.postgres:
            return f"strpos({haystack}, {needle}) > 0"
        return f"instr({haystack}, {needle}) > 0"


SQLITE = Dialect("sqlite")
POSTGRES = Dialect("postgresql")


@functools.lru_cache(maxsize=1024)
def to_postgres(sql: str) -> str:
    """SQLite-style SQL text for psycopg: ``?`` becomes ``%s``, a literal ``%`` becomes
    ``%%`` (psycopg reads ``%`` as the start of a placeholder everywhere). Quoted text
    ('...', "...", $$...$$) keeps its question marks."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"":
            end = i + 1
            while end < n:
                if sql[end] == ch:
                    if end + 1 < n and sql[end + 1] == ch:  # a doubled quote inside
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1].replace("%", "%%"))
            i = end + 1
        elif sql.startswith("$$", i):
            end = sql.find("$$", i + 2)
            end = n if end < 0 else end + 2
            out.append(sql[i:end].replace("%", "%%"))
            i = end
        elif ch == "?":
            if i + 1 < n and sql[i + 1].isdigit():
                raise StorageError(f"numbered placeholders are SQLite-only: {sql[:60]!r}")
            out.append("%s")
            i += 1
        elif ch == "%":
            out.append("%%")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


NUL_STAND_IN = "\ufffd"
"""What a NUL character becomes on PostgreSQL, whose text type cannot hold one."""


def without_nul(params: Sequence[Any]) -> tuple[Any, ...]:
    """`params` with each NUL in a text value, or NUL escape in a JSON value, replaced by
    `NUL_STAND_IN`.

    SQLite stores a NUL; PostgreSQL refuses a statement with one in text, and its jsonb
    (which the queries cast JSON columns to) refuses the escape, so one such row would
    break every later query over the column. Members' text is cleaned by the adapters, but
    a model's reply, summary or narrative can hold one.
    """
    if not any(isinstance(p, str) and ("\x00" in p or "\\u0000" in p) for p in params):
        return tuple(params)
    out = tuple(_nul_free(p) if isinstance(p, str) else p for p in params)
    if out != tuple(params):
        log.warning("a NUL character in a value for PostgreSQL was replaced by U+FFFD")
    return out


def _nul_free(text: str) -> str:
    text = text.replace("\x00", NUL_STAND_IN)
    if text[:1] in ("{", "[") and "\\u0000" in text:
        text = _JSON_NUL.sub(r"\1\\ufffd", text)
    return text


class Conn:
    """The connection one ``fn`` runs on, inside its transaction, on either engine.

    Statements go through `execute`/`fetchall`/`fetchone` (module functions below), which
    translate placeholders for PostgreSQL and turn either engine's integrity errors into
    `IntegrityViolation`.
    """

    __slots__ = ("dialect", "raw")

    def __init__(self, raw: Any, dialect: Dialect) -> None:
        self.raw = raw
        self.dialect = dialect

    def cursor(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; the caller reads and closes the cursor."""
        with _as_integrity_violation():
            if self.dialect.postgres:
                return self.raw.execute(to_postgres(sql), without_nul(params))
            return self.raw.execute(sql, tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        data = [tuple(r) for r in rows]
        with _as_integrity_violation():
            if self.dialect.postgres:
                with self.raw.cursor() as cur:
                    cur.executemany(to_postgres(sql), [without_nul(row) for row in data])
            else:
                self.raw.executemany(sql, data)


@contextlib.contextmanager
def _as_integrity_violation() -> Iterator[None]:
    """Either engine's integrity error raised as `IntegrityViolation`."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise IntegrityViolation(str(exc)) from exc
    except Exception as exc:
        mapped = _integrity_of(exc)
        if mapped is None:
            raise
        raise mapped from exc


def _integrity_of(exc: BaseException) -> IntegrityViolation | None:
    """`IntegrityViolation` for a psycopg integrity error (None for anything else)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return None
    if isinstance(exc, psycopg.errors.IntegrityError):
        diag = exc.diag.message_primary
        return IntegrityViolation(diag or str(exc))
    return None


# --- engines ---------------------------------------------------------------------------


class Engine(Protocol):
    """Where `SqlBase` sends its operations: one call per transaction."""

    dialect: Dialect

    async def write(self, fn: Callable[[Conn], T], scope: str | None = None) -> T: ...

    async def read(self, fn: Callable[[Conn], T]) -> T: ...

    async def outside_transaction(self, fn: Callable[[Conn], T]) -> T: ...

    async def close(self) -> None: ...


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


def write_transaction(conn: sqlite3.Connection, fn: Callable[[Conn], T]) -> T:
    """``BEGIN IMMEDIATE``, `fn`, ``COMMIT``; ``ROLLBACK`` if anything raises, COMMIT included.

    IMMEDIATE takes SQLite's write lock up front, so another process sharing the file
    waits (busy_timeout) at BEGIN instead of failing halfway through.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(Conn(conn, SQLITE))
        conn.commit()
    except BaseException:
        conn.rollback()  # a no-op if SQLite already ended the transaction
        raise
    return result


def read_snapshot(conn: sqlite3.Connection, fn: Callable[[Conn], T]) -> T:
    """Run `fn` in a deferred transaction, so all its queries see one consistent state."""
    conn.execute("BEGIN")
    try:
        return fn(Conn(conn, SQLITE))
    finally:
        conn.rollback()


class SqliteEngine:
    """One aiosqlite connection; each operation is one call into its worker thread."""

    dialect = SQLITE

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    async def write(self, fn: Callable[[Conn], T], scope: str | None = None) -> T:
        # `scope` needs no lock here: one connection runs one transaction at a time,
        # and BEGIN IMMEDIATE holds the file's write lock against other processes.
        return await run_on_sqlite_thread(self.conn, lambda c: write_transaction(c, fn))

    async def read(self, fn: Callable[[Conn], T]) -> T:
        return await run_on_sqlite_thread(self.conn, lambda c: read_snapshot(c, fn))

    async def outside_transaction(self, fn: Callable[[Conn], T]) -> T:
        """For statements that cannot run in a transaction (VACUUM, checkpoints)."""
        return await run_on_sqlite_thread(self.conn, lambda c: fn(Conn(c, SQLITE)))

    async def close(self) -> None:
        await self.conn.close()


MAX_WRITE_ATTEMPTS = 12
"""Runs of one write on PostgreSQL before a deadlock or serialization failure is given
up on; with the back-off below that is well over a second of contention."""

RETRY_SQLSTATES = frozenset({"40001", "40P01"})
"""serialization_failure and deadlock_detected: the transaction was rolled back whole
and running it again is the documented remedy."""

STALE_BORROWS = 3
"""Borrows in a row that may find a dead connection before an operation gives up: the
first makes the pool check all its idle ones, so a second finding one means the server
keeps dropping new connections too."""

SCOPE_LOCKS = 0x534F4E41
"""The first key of every write-scope advisory lock (the second is the scope's hash),
so they never meet single-key advisory locks taken elsewhere (the migration lock)."""

GLOBAL_SCOPE = "*"
"""The scope of writes that name none: they take one lock, so they run one at a time
across every process, exactly as every write does on SQLite."""


class PostgresEngine:
    """A psycopg connection pool; each operation borrows one connection in a thread.

    Why writes run at READ COMMITTED under a lock on their scope, not at SERIALIZABLE:
    the storage code was written for SQLite's single writer, with "read, then write"
    steps such as "the latest version, then insert the next" or "the highest exchange
    number, then the next". A transaction-level advisory lock on the write's scope (its
    community; everything without one shares `GLOBAL_SCOPE`) gives every such step a
    single writer again, across processes, while different communities write in
    parallel; READ COMMITTED then lets each statement after the lock see everything the
    previous holder committed. SERIALIZABLE was measured first and rejected: on small
    tables PostgreSQL's predicate locks cover whole pages or relations, so 20
    communities writing at once aborted each other until a write failed 12 times in a
    row. Where scopes meet (a retention window deletes rows a community's write
    touches), row locks order them and every statement re-checks its WHERE clause.
    A deadlock (40P01) re-runs the whole ``fn`` a bounded number of times.

    Reads are one REPEATABLE READ, READ ONLY snapshot, never blocked by writers.
    """

    dialect = POSTGRES

    def __init__(self, pool: ConnectionPool, where: str, threads: int) -> None:
        self.pool = pool
        self.where = where  # host/port/database for messages; never the password
        # One thread per pooled connection: a thread never waits for a connection.
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="postgres")
        self._busy: set[asyncio.Future[Any]] = set()

    async def _in_thread(self, work: Callable[[], T]) -> T:
        # Tracked so `close` lets every operation already started finish first, as the
        # SQLite engine's queue does. A cancelled caller drops only the result: the
        # thread still commits or rolls back the whole transaction, and the
        # cancellation is passed on once it has, so the caller's next operation sees
        # the outcome (as on SQLite, where it queues behind it).
        future = asyncio.get_running_loop().run_in_executor(self._threads, work)
        self._busy.add(future)
        future.add_done_callback(self._busy.discard)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            while not future.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({future})
            raise

    async def write(self, fn: Callable[[Conn], T], scope: str | None = None) -> T:
        return await self._in_thread(lambda: self._write(fn, scope or GLOBAL_SCOPE))

    async def read(self, fn: Callable[[Conn], T]) -> T:
        return await self._in_thread(lambda: self._transaction(fn, None))

    async def outside_transaction(self, fn: Callable[[Conn], T]) -> T:
        def work() -> T:
            with self._connection() as raw:
                raw.read_only = False
                return fn(Conn(raw, POSTGRES))

        return await self._in_thread(work)

    def _write(self, fn: Callable[[Conn], T], scope: str) -> T:
        import psycopg

        for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
            try:
                return self._transaction(fn, scope)
            except psycopg.errors.OperationalError as exc:
                if exc.sqlstate not in RETRY_SQLSTATES:
                    raise
                if attempt == MAX_WRITE_ATTEMPTS:
                    raise StorageError(
                        f"PostgreSQL at {self.where}: a write kept conflicting with "
                        f"concurrent ones ({attempt} attempts); nothing of it was written"
                    ) from exc
                log.debug(
                    "write conflict (%s), attempt %d: running it again", exc.sqlstate, attempt
                )
                # Jittered back-off, so two writers that collided do not collide again.
                time.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 7)))
        raise AssertionError("unreachable")  # pragma: no cover

    def _transaction(self, fn: Callable[[Conn], T], scope: str | None) -> T:
        """A write (under the lock of `scope`) or, with no scope, a read snapshot."""
        import psycopg

        with self._connection() as raw:
            # Client-side settings: psycopg puts them into the BEGIN it sends.
            raw.isolation_level = (
                psycopg.IsolationLevel.REPEATABLE_READ
                if scope is None
                else psycopg.IsolationLevel.READ_COMMITTED
            )
            raw.read_only = scope is None
            with raw.transaction():
                conn = Conn(raw, POSTGRES)
                if scope is not None:
                    execute(
                        conn,
                        "SELECT pg_advisory_xact_lock(?::integer, hashtext(?))",
                        (SCOPE_LOCKS, scope),
                    )
                return fn(conn)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A pooled connection, as `pool.connection()` lends one (its transaction ended
        on return), that has just answered a round trip (`_answering`)."""
        import psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        try:
            raw = self._answering()
            try:
                with raw:  # a pooled connection is not closed here, only its transaction
                    yield raw
            finally:
                self.pool.putconn(raw)
        except PoolClosed:
            raise StorageError("the database is closed") from None
        except PoolTimeout:
            raise StorageError(f"PostgreSQL at {self.where} did not answer in time") from None
        except psycopg.OperationalError as exc:
            if exc.sqlstate in RETRY_SQLSTATES:
                raise
            raise StorageError(f"PostgreSQL at {self.where}: {first_line(exc)}") from exc

    def _answering(self) -> Any:
        """A connection from the pool that answers an empty query.

        Why not the pool's own `check`: after a server restart or a failover every idle
        connection is dead, and psycopg_pool (3.3) tries them one at a time, pausing 1,
        2, 4, 8, 16 s between tries; with the 8 of a grown pool the operation ran into
        the pool's 30 s timeout and failed. Here the first dead one makes the pool test
        every idle connection at once (`pool.check`, which drops the dead and opens new
        ones), and the next borrow gets a new connection without a pause.
        """
        from psycopg_pool import ConnectionPool

        for _ in range(STALE_BORROWS):
            raw = self.pool.getconn()
            try:
                ConnectionPool.check_connection(raw)
            except Exception as exc:
                self.pool.putconn(raw)  # a broken connection is closed and replaced
                log.warning(
                    "PostgreSQL at %s: a pooled connection was dead (%s); checking the rest",
                    self.where,
                    first_line(exc),
                )
                self.pool.check()
                continue
            return raw
        raise StorageError(
            f"PostgreSQL at {self.where}: {STALE_BORROWS} connections in a row were dead"
        )

    async def close(self) -> None:
        if self._busy:
            await asyncio.gather(*self._busy, return_exceptions=True)
        await asyncio.to_thread(self.pool.close)
        self._threads.shutdown(wait=False)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


REBUILD_PAUSE_FACTOR = 3.0
"""After a rebuild of the SQLite file, the next waits this many times as long as it took."""
REBUILD_PAUSE_LIMIT = 60.0
"""...but never longer than this many seconds."""


class PacedRebuilds:
    """The SQLite file's rebuilds (VACUUM) after erasures, joined and paced.

    A rebuild holds the one connection every community uses for as long as the whole
    file takes to copy, and any member can ask for one: a forget-me after a message or a
    refused moderator command. So a rebuild that starts after an erase committed covers
    it, and erases that wait for the same one share it; and a rebuild starts no sooner
    than `REBUILD_PAUSE_FACTOR` times the last one's length after it ended, so rebuilds
    hold the database at most a quarter of the time whoever asks. The erase waits for
    its rebuild: when it returns, the file holds no copy of what it erased."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._asked = 0  # erases that asked, in order
        self._covered = 0  # erases committed before the last rebuild started
        self._next_at = 0.0  # time.monotonic() when the next rebuild may start

    async def after_erase(self, rebuild: Callable[[], Awaitable[object]]) -> None:
        """Call once the erase is committed; returns once a rebuild started since ran."""
        self._asked += 1
        mine = self._asked
        async with self._lock:
            if self._covered >= mine:
                return
            await asyncio.sleep(max(0.0, self._next_at - time.monotonic()))
            covers = self._asked
            started = time.monotonic()
            await rebuild()
            ended = time.monotonic()
            self._covered = covers
            self._next_at = ended + min(
                REBUILD_PAUSE_LIMIT, REBUILD_PAUSE_FACTOR * (ended - started)
            )


class SqlBase:
    """The engine + transaction helpers; package-internal (only `storage` speaks SQL)."""

    def __init__(self, engine: Engine, tz: tzinfo = UTC) -> None:
        self._engine = engine
        self.dialect = engine.dialect
        # The zone whose calendar days token usage is summed by (SONALITY_TIMEZONE):
        # spending limits and `/sonality usage` speak of the community's "today".
        self.tz = tz
        # Only `close` uses it (a second close waits for the first); transactions need no
        # lock, see the module docstring.
        self._close_lock = asyncio.Lock()
        self._closed = False
        self._rebuilds = PacedRebuilds()

    @property
    def _conn(self) -> aiosqlite.Connection:
        """The aiosqlite connection (SQLite only: tests count the calls into its thread)."""
        if not isinstance(self._engine, SqliteEngine):
            raise StorageError("this database is not SQLite")
        return self._engine.conn

    async def _run_write(self, fn: Callable[[Conn], T], scope: str | None = None) -> T:
        """Run `fn` as one write transaction (all or nothing) in one round trip.

        `fn` is synchronous and must do all its work on the connection it is given; on
        SQLite it runs between ``BEGIN IMMEDIATE`` and ``COMMIT`` (``ROLLBACK`` on any
        exception, which is then raised here) and no other storage operation runs while
        it does. On PostgreSQL no other write of the same `scope` runs while it does:
        give the community id when `fn` reads and writes only that community's rows
        (other communities then write in parallel); without a scope it runs one at a
        time with every other unscoped write. It may run again after a deadlock (see
        the module docstring). If the caller is cancelled after the call was handed
        over, the transaction still completes or rolls back entirely.
        """
        self._ensure_open()
        return await self._engine.write(fn, scope)

    async def _run_read(self, fn: Callable[[Conn], T]) -> T:
        """Run `fn`'s queries in one round trip, as one consistent snapshot (then ROLLBACK)."""
        self._ensure_open()
        return await self._engine.read(fn)

    async def _run_outside_transaction(self, fn: Callable[[Conn], T]) -> T:
        self._ensure_open()
        return await self._engine.outside_transaction(fn)

    async def _scrub_deleted(self, tables: Sequence[str], *, rebuild: bool) -> None:
        """After deleting a member's or a community's rows: leave as few copies behind
        as the engine allows.

        SQLite (secure_delete is on) zeroes deleted cells, but not the old copies a
        b-tree rebalance leaves when it moves cells between pages, so with `rebuild` the
        file is rebuilt (VACUUM); then the WAL, which still holds the pages as they
        were, is emptied. PostgreSQL keeps deleted rows in the table's pages until
        VACUUM frees them, so `tables` are vacuumed (plain VACUUM: no exclusive lock).
        Zeroing bytes is SQLite-only: on PostgreSQL, freed space and WAL segments are
        overwritten as the server reuses them.
        """
        if self.dialect.postgres:
            names = ", ".join(f'"{table}"' for table in tables)
            if names:
                await self._run_outside_transaction(lambda conn: execute(conn, f"VACUUM {names}"))
            return
        if rebuild:
            await self._rebuilds.after_erase(
                lambda: self._run_outside_transaction(lambda conn: fetchall(conn, "VACUUM"))
            )
        await self._run_outside_transaction(
            lambda conn: fetchall(conn, "PRAGMA wal_checkpoint(TRUNCATE)")
        )

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


IDS_PER_QUERY = 500
"""Ids per ``IN (...)`` list: SQLite's limit on `?` parameters in one statement is 999
on older builds."""


def id_chunks(ids: Sequence[str]) -> Iterator[tuple[list[str], str]]:
    """`ids` in pieces short enough for one statement, each with its ``?, ?, ...``."""
    for start in range(0, len(ids), IDS_PER_QUERY):
        chunk = list(ids[start : start + IDS_PER_QUERY])
        yield chunk, ", ".join("?" * len(chunk))


def fetchall(conn: Conn, sql: str, params: Iterable[Any] = ()) -> list[Row]:
    cur = conn.cursor(sql, tuple(params))
    try:
        return [tuple(row) for row in cur.fetchall()]
    finally:
        cur.close()


def fetchone(conn: Conn, sql: str, params: Iterable[Any] = ()) -> Row | None:
    """The first row (the statement is finished either way, e.g. an UPDATE ... RETURNING)."""
    cur = conn.cursor(sql, tuple(params))
    try:
        row = cur.fetchone()
    finally:
        cur.close()
    return None if row is None else tuple(row)


def execute(conn: Conn, sql: str, params: Iterable[Any] = ()) -> int:
    """Run one statement; returns the number of rows it changed."""
    cur = conn.cursor(sql, tuple(params))
    try:
        return int(cur.rowcount)
    finally:
        cur.close()


def insert_returning_id(conn: Conn, sql: str, params: Iterable[Any] = ()) -> int:
    """Run an INSERT of one row and return its generated ``id`` (``RETURNING id``)."""
    row = fetchone(conn, sql + " RETURNING id", params)
    if row is None:  # pragma: no cover - an INSERT ... VALUES always returns its row
        raise StorageError("the insert returned no id")
    return int(row[0])


def table_exists(conn: Conn, name: str) -> bool:
    if conn.dialect.postgres:
        sql = (
            "SELECT 1 FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_name = ?"
        )
    else:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return fetchone(conn, sql, (name,)) is not None


def ensure_community(conn: Conn, community_id: str, at: datetime) -> None:
    """Create the community row if missing (every per-community row references it)."""
    if not community_id:
        raise StorageError("community_id must not be empty")
    execute(
        conn,
        "INSERT INTO communities (id, platform, name, created_at) VALUES (?, ?, '', ?) "
        "ON CONFLICT DO NOTHING",
        (community_id, platform_of(community_id), to_db_time(at)),
    )


def advance_time(
    conn: Conn,
    community_id: str,
    column: Literal["last_activity_at", "last_reflection_time"],
    at: datetime,
) -> None:
    """Move one of a community's times forward to `at`, creating its row if missing.

    Never backwards: a late writer can't hide newer activity or a newer reflection.
    One statement (an upsert), as it runs inside the write a reply waits for.
    """
    if not community_id:
        raise StorageError("community_id must not be empty")
    stamp = to_db_time(at)
    execute(
        conn,
        f"INSERT INTO communities (id, platform, name, created_at, {column}) "
        "VALUES (?, ?, '', ?, ?) "
        f"ON CONFLICT (id) DO UPDATE SET {column} = excluded.{column} "
        f"WHERE communities.{column} IS NULL OR communities.{column} < excluded.{column}",
        (community_id, platform_of(community_id), stamp, stamp),
    )


def local_day(at: datetime, tz: tzinfo) -> date:
    """The calendar day `at` falls on in `tz` (naive values are taken to be UTC)."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(tz).date()


def insert_usage(
    conn: Conn,
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
        "calls = usage_daily.calls + 1, "
        "input_tokens = usage_daily.input_tokens + excluded.input_tokens, "
        "output_tokens = usage_daily.output_tokens + excluded.output_tokens, "
        "cache_write_tokens = usage_daily.cache_write_tokens + excluded.cache_write_tokens, "
        "cache_read_tokens = usage_daily.cache_read_tokens + excluded.cache_read_tokens",
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
