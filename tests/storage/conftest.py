"""Shared fixtures: every test gets its own empty database, on each engine.

`db` (and `backend`) are parametrized over SQLite and PostgreSQL, so every storage test
that uses them runs on both: a SQLite file under tmp_path, or a fresh database on the
session's real PostgreSQL server (tests/pg.py). Tests about the SQLite file itself
(probe, WAL, pragmas, secure_delete bytes, files from older releases) use `db_path`
directly and stay SQLite-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from sonality.llm import Usage
from sonality.state import SpongeState
from sonality.store import (
    AuditEvent,
    Episode,
    InteractionRecord,
    Speaker,
    StateCommit,
    UsageRecord,
)
from storage import Database
from storage.base import to_postgres
from storage.migrations import MIGRATIONS, migrate
from storage.postgres import open_postgres
from tests.pg import PostgresServer

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def state(version: int) -> SpongeState:
    return SpongeState(version=version, interaction_count=version)


def commit_of(
    version: int,
    *,
    interaction_id: str | None = None,
    cause: str = "interaction",
    events: list[AuditEvent] | None = None,
    usage: list[UsageRecord] | None = None,
) -> StateCommit:
    """A commit of an otherwise default state at `version`."""
    return StateCommit(
        state=state(version),
        cause=cause,
        change=f"v{version}",
        events=events or [],
        usage=usage or [],
        interaction_id=interaction_id,
    )


def record(interaction_id: str, message: str = "hi", minutes: float = 0) -> InteractionRecord:
    return InteractionRecord(
        id=interaction_id,
        speaker=Speaker(id="u1", name="Ada"),
        message=message,
        reply=f"reply to {message}",
        created_at=at(minutes),
        model="test-model",
        reply_usage=Usage(input_tokens=10, output_tokens=5, cache_read_tokens=2),
    )


def episode(eid: str, **fields: Any) -> Episode:
    return Episode(id=eid, user_message=f"message {eid}", summary=f"summary {eid}", **fields)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "dir" / "bot.sqlite3"


class Backend:
    """One test's database on one engine, and plain SQL access to it beside the bot's.

    `sql`/`run` use a connection of their own (autocommit), as an operator's shell
    would: what they see is what was committed.
    """

    def __init__(self, name: str, path: Path, url: str | None) -> None:
        self.name = name
        self.path = path
        self.url = url

    @property
    def postgres(self) -> bool:
        return self.url is not None

    @property
    def integrity_error(self) -> type[Exception]:
        """What the engine's own driver raises when the schema refuses a change."""
        if self.postgres:
            import psycopg

            return psycopg.errors.IntegrityError
        return sqlite3.IntegrityError

    async def open(self, timezone: str = "UTC") -> Database:
        if self.url is not None:
            return await Database.open_url(self.url, timezone=timezone)
        return await Database.open(self.path, timezone=timezone)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[object]:
        if self.url is not None:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as conn:
                yield conn
        else:
            with contextlib.closing(sqlite3.connect(self.path, isolation_level=None)) as conn:
                yield conn

    async def migrate_to(self, version: int) -> None:
        """Bring an empty database to schema `version` only, as an older release left it."""
        if self.url is not None:
            engine = await asyncio.to_thread(open_postgres, self.url)
            try:
                assert await migrate(engine, MIGRATIONS[:version]) == version
            finally:
                await engine.close()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        async with aiosqlite.connect(self.path, isolation_level=None) as conn:
            assert await migrate(conn, MIGRATIONS[:version]) == version

    def tables(self) -> set[str]:
        if self.postgres:
            query = (
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        else:
            query = "SELECT name FROM sqlite_master WHERE type = 'table'"
        return {str(r[0]) for r in self.sql(query)} - {"sqlite_sequence"}

    def sql(self, query: str, params: Iterable[object] = ()) -> list[tuple[object, ...]]:
        """The rows of one query (``?`` placeholders on both engines)."""
        with self._connection() as conn:
            text = to_postgres(query) if self.postgres else query
            cur = conn.execute(text, tuple(params))  # type: ignore[attr-defined]
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def run(self, query: str, params: Iterable[object] = ()) -> None:
        """Run one statement, committed on return."""
        self.sql(query, params)


_SCHEMA_PRINT = """
SELECT string_agg(x, ',' ORDER BY x) FROM (
    SELECT 'table:' || table_name || '.' || column_name || ':' || data_type
        FROM information_schema.columns WHERE table_schema = current_schema()
    UNION ALL SELECT 'trigger:' || tgname FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT 'function:' || md5(prosrc) FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = current_schema()
    UNION ALL SELECT 'constraint:' || conname FROM pg_constraint c
        JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = current_schema()
    UNION ALL SELECT 'version:' || version FROM schema_migrations
) AS t(x)
"""


class ReusedDatabase:
    """One PostgreSQL database at the current schema, emptied between tests.

    Why not a fresh copy per test: CREATE DATABASE copies the template's files and takes
    a checkpoint (0.3-0.8 s here), emptying the tables takes milliseconds. A test that
    changed the schema itself (dropped a trigger, recorded a future version) leaves a
    different fingerprint, and the database is then made again from the template.
    """

    def __init__(self, server: PostgresServer, template: str) -> None:
        self.server = server
        self.template = template
        self.url = server.new_database(template)
        self.print = self._fingerprint()

    def _fingerprint(self) -> str:
        import psycopg

        with psycopg.connect(self.url) as conn:
            row = conn.execute(_SCHEMA_PRINT).fetchone()
        return str(row[0] if row else "")

    def fresh(self) -> str:
        """The URL of an empty database at the current schema."""
        import psycopg

        if self._fingerprint() != self.print:
            self.server.drop(self.url)
            self.url = self.server.new_database(self.template)
            return self.url
        with psycopg.connect(self.url, autocommit=True) as conn:
            tables = [
                str(r[0])
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() AND table_name <> 'schema_migrations'"
                )
            ]
            names = ", ".join(f'"{t}"' for t in tables)
            conn.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
        return self.url


@pytest.fixture(scope="session")
def migrated_database(postgres_server: PostgresServer) -> ReusedDatabase:
    url = postgres_server.new_database()

    async def migrate() -> None:
        await (await Database.open_url(url)).close()

    asyncio.run(migrate())
    return ReusedDatabase(postgres_server, url.rsplit("/", 1)[1])


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, db_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Backend("sqlite", db_path, None)
        return
    reused: ReusedDatabase = request.getfixturevalue("migrated_database")
    yield Backend("postgresql", db_path, reused.fresh())


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_backend(request: pytest.FixtureRequest, db_path: Path) -> Iterator[Backend]:
    """Like `backend`, but with no schema at all (for tests of older schemas)."""
    if request.param == "sqlite":
        yield Backend("sqlite", db_path, None)
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.new_database()
    try:
        yield Backend("postgresql", db_path, url)
    finally:
        server.drop(url)


@pytest.fixture
async def db(backend: Backend) -> AsyncIterator[Database]:
    database = await backend.open()
    try:
        yield database
    finally:
        await database.close()
