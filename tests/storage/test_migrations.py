"""Opening, pragmas and forward migrations."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from storage import Database, SchemaTooNewError
from storage.db import BUSY_TIMEOUT_MS
from storage.migrations import MIGRATIONS, SCHEMA_VERSION, Statement, migrate, postgres_ddl
from tests.pg import PostgresServer

from .conftest import Backend

EXPECTED_TABLES = {
    "communities",
    "personality_versions",
    "interactions",
    "audit_events",
    "usage_daily",
    "community_budgets",
    "moderator_actions",
    "conversation_turns",
    "seen_events",
    "installations",
    "oauth_states",
    "episode_outbox",
    "schema_migrations",
    "community_removals",
    "community_erasures",
    "evidence_log",
    "forget_requests",
    "flood_windows",
    "member_spend",
    "reply_feedback",
    "channel_modes",
    "bot_exchanges",
    "message_deletions",
}


def _tables(backend: Backend) -> set[str]:
    if backend.postgres:
        query = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    else:
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    return {str(r[0]) for r in backend.sql(query)} - {"sqlite_sequence"}


def _applied(backend: Backend) -> list[int]:
    rows = backend.sql("SELECT version FROM schema_migrations ORDER BY version")
    return [int(str(r[0])) for r in rows]


async def test_fresh_database_gets_the_full_schema(db: Database, backend: Backend) -> None:
    assert db.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    assert db.engine_name == backend.name
    assert _applied(backend) == list(range(1, SCHEMA_VERSION + 1))
    assert _tables(backend) == EXPECTED_TABLES


async def test_fresh_file_gets_its_pragmas(db_path: Path) -> None:
    """SQLite-only: WAL, foreign keys and timeouts are settings of the SQLite file."""
    db = await Database.open(db_path)
    try:
        assert db.path == db_path  # under nested/dir/: parent directories were created
        assert await db._fetchone("PRAGMA journal_mode") == ("wal",)
        assert await db._fetchone("PRAGMA foreign_keys") == (1,)
        assert await db._fetchone("PRAGMA synchronous") == (1,)  # NORMAL
        assert await db._fetchone("PRAGMA busy_timeout") == (BUSY_TIMEOUT_MS,)
    finally:
        await db.close()
    # WAL is a property of the file: a plain connection sees it too.
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_an_empty_postgres_database_is_migrated_once_by_two_openers(
    postgres_server: PostgresServer,
) -> None:
    """Two processes starting at once on an empty database: each step is applied once
    (the advisory lock), and both end at the current schema."""
    url = postgres_server.new_database()
    try:
        first, second = await asyncio.gather(Database.open_url(url), Database.open_url(url))
        assert first.schema_version == second.schema_version == SCHEMA_VERSION
        await first.close()
        await second.close()
        backend = Backend("postgresql", Path("unused"), url)
        assert _applied(backend) == list(range(1, SCHEMA_VERSION + 1))
        assert _tables(backend) == EXPECTED_TABLES
    finally:
        postgres_server.drop(url)


async def test_reopen_is_idempotent_and_keeps_data(backend: Backend) -> None:
    first = await backend.open()
    await first.touch_community("discord:1", "Guild", None)
    await first.close()

    second = await backend.open()
    try:
        assert second.schema_version == SCHEMA_VERSION
        assert await second.community_ids() == ["discord:1"]
    finally:
        await second.close()
    assert _applied(backend) == list(range(1, SCHEMA_VERSION + 1))


async def test_new_migration_applies_once_on_reopen(backend: Backend) -> None:
    extra: list[list[Statement]] = [
        *MIGRATIONS,
        ["CREATE TABLE extra (x INTEGER)", "INSERT INTO extra VALUES (7)"],
    ]
    db = await backend.open()
    try:
        for _ in range(2):
            assert await migrate(db._engine, extra) == SCHEMA_VERSION + 1
    finally:
        await db.close()
    assert backend.sql("SELECT x FROM extra") == [(7,)]
    assert _applied(backend)[-1] == SCHEMA_VERSION + 1


async def test_failed_migration_leaves_previous_schema(backend: Backend) -> None:
    broken: list[list[Statement]] = [
        *MIGRATIONS,
        ["CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"],
    ]
    if backend.postgres:
        import psycopg

        refused: type[Exception] = psycopg.errors.SyntaxError
    else:
        refused = sqlite3.OperationalError
    db = await backend.open()
    try:
        with pytest.raises(refused):
            await migrate(db._engine, broken)
    finally:
        await db.close()
    assert "half_done" not in _tables(backend)
    assert _applied(backend) == list(range(1, SCHEMA_VERSION + 1))


async def test_newer_schema_is_refused(backend: Backend) -> None:
    await (await backend.open()).close()
    backend.run("INSERT INTO schema_migrations VALUES (99, '2030-01-01T00:00:00+00:00')")
    with pytest.raises(SchemaTooNewError):
        await backend.open()


def test_postgres_ddl_maps_only_column_types() -> None:
    table = postgres_ddl(
        "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER, r REAL, "
        "b BLOB, s TEXT NOT NULL) WITHOUT ROWID"
    )
    assert table == (
        "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, n BIGINT, "
        'r DOUBLE PRECISION, b BYTEA, s TEXT COLLATE "C" NOT NULL)'
    )
    index = "CREATE INDEX i ON t (s, n)"
    assert postgres_ddl(index) == index
