"""Episodes committed with a version wait in SQLite until Chroma confirms them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from sonality.store import SEMANTIC
from storage import Database, VersionConflictError
from storage.migrations import MIGRATIONS, migrate

from .conftest import Backend, commit_of, episode


async def test_committed_episodes_are_pending_until_marked_written(backend: Backend) -> None:
    db = await backend.open()
    store = db.community("discord:1")
    commit = commit_of(0)
    commit.episodes.extend([episode("a"), episode("b", memory_type=SEMANTIC, ess_score=1.0)])
    await store.commit(commit)
    await db.close()

    db = await backend.open()  # survives a restart
    store = db.community("discord:1")
    pending = await store.pending_episodes()
    assert [e.id for e in pending] == ["a", "b"]
    assert pending[1].memory_type == SEMANTIC and pending[1].ess_score == 1.0
    assert await db.community("discord:2").pending_episodes() == []
    await store.mark_episodes_written(["a"])
    assert [e.id for e in await store.pending_episodes()] == ["b"]
    await store.mark_episodes_written(["b", "unknown"])
    assert await store.pending_episodes() == []
    await db.close()


async def test_a_rejected_commit_queues_no_episode(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    bad = commit_of(5)
    bad.episodes.append(episode("x"))
    with pytest.raises(VersionConflictError):
        await store.commit(bad)
    assert await store.pending_episodes() == []


async def test_an_existing_v1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    async with aiosqlite.connect(path, isolation_level=None) as conn:  # a file from before v2
        assert await migrate(conn, MIGRATIONS[:1]) == 1
    with sqlite3.connect(path) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert ("episode_outbox",) not in tables
    db = await Database.open(path)
    assert db.schema_version == len(MIGRATIONS)
    commit = commit_of(0)
    commit.episodes.append(episode("a"))
    await db.community("c").commit(commit)
    assert [e.id for e in await db.community("c").pending_episodes()] == ["a"]
    await db.close()
