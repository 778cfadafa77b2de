"""Opening, pragmas and forward migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from storage import Database, SchemaTooNewError
from storage.db import BUSY_TIMEOUT_MS
from storage.migrations import MIGRATIONS, SCHEMA_VERSION, migrate

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
}


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows} - {"sqlite_sequence"}


def _applied(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    return [r[0] for r in rows]


async def test_fresh_file_gets_full_schema_and_pragmas(db: Database, db_path: Path) -> None:
    assert db.path == db_path  # under nested/dir/: parent directories were created
    assert db.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    assert _applied(db_path) == list(range(1, SCHEMA_VERSION + 1))
    assert _tables(db_path) == EXPECTED_TABLES
    assert await db._fetchone("PRAGMA journal_mode") == ("wal",)
    assert await db._fetchone("PRAGMA foreign_keys") == (1,)
    assert await db._fetchone("PRAGMA synchronous") == (1,)  # NORMAL
    assert await db._fetchone("PRAGMA busy_timeout") == (BUSY_TIMEOUT_MS,)
    # WAL is a property of the file: a plain connection sees it too.
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_reopen_is_idempotent_and_keeps_data(db_path: Path) -> None:
    first = await Database.open(db_path)
    await first.touch_community("discord:1", "Guild", None)
    await first.close()

    second = await Database.open(db_path)
    try:
        assert second.schema_version == SCHEMA_VERSION
        assert await second.community_ids() == ["discord:1"]
    finally:
        await second.close()
    assert _applied(db_path) == list(range(1, SCHEMA_VERSION + 1))


async def test_new_migration_applies_once_on_reopen(db_path: Path) -> None:
    await (await Database.open(db_path)).close()  # a file at the current version
    extra = [*MIGRATIONS, ["CREATE TABLE extra (x INTEGER)", "INSERT INTO extra VALUES (7)"]]
    for _ in range(2):
        async with aiosqlite.connect(db_path, isolation_level=None) as conn:
            assert await migrate(conn, extra) == SCHEMA_VERSION + 1
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT x FROM extra").fetchall() == [(7,)]
    assert _applied(db_path)[-1] == SCHEMA_VERSION + 1


async def test_failed_migration_leaves_previous_schema(db_path: Path) -> None:
    await (await Database.open(db_path)).close()
    broken = [*MIGRATIONS, ["CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"]]
    async with aiosqlite.connect(db_path, isolation_level=None) as conn:
        with pytest.raises(sqlite3.OperationalError):
            await migrate(conn, broken)
    assert "half_done" not in _tables(db_path)
    assert _applied(db_path) == list(range(1, SCHEMA_VERSION + 1))


async def test_newer_schema_is_refused(db_path: Path) -> None:
    await (await Database.open(db_path)).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, '2030-01-01T00:00:00+00:00')")
    with pytest.raises(SchemaTooNewError):
        await Database.open(db_path)
