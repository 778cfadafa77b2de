"""Episodes committed with a version wait in SQLite until Chroma confirms them."""

from __future__ import annotations

import pytest

from sonality.store import SEMANTIC
from storage import Database, VersionConflictError
from storage.migrations import MIGRATIONS

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


async def test_the_outbox_keeps_no_reply_text(db: Database, backend: Backend) -> None:
    """No memory store keeps the bot's reply or the topics, so the outbox does not
    either; what the memory write reads comes back whole."""
    store = db.community("discord:1")
    commit = commit_of(0)
    commit.episodes.append(
        episode("a").model_copy(
            update={"agent_response": "the bot's reply", "topics": ("tea",), "summary": "S"}
        )
    )
    await store.commit(commit)
    [(stored,)] = backend.sql("SELECT episode_json FROM episode_outbox")
    assert "the bot's reply" not in str(stored) and "tea" not in str(stored)
    [pending] = await store.pending_episodes()
    assert (pending.agent_response, pending.topics) == ("", ())
    kept = pending.model_dump(exclude={"agent_response", "topics"})
    assert kept == commit.episodes[0].model_dump(exclude={"agent_response", "topics"})


async def test_a_rejected_commit_queues_no_episode(db: Database) -> None:
    store = db.community("discord:1")
    await store.commit(commit_of(0))
    bad = commit_of(5)
    bad.episodes.append(episode("x"))
    with pytest.raises(VersionConflictError):
        await store.commit(bad)
    assert await store.pending_episodes() == []


async def test_an_existing_v1_database_is_upgraded_in_place(empty_backend: Backend) -> None:
    await empty_backend.migrate_to(1)  # a database from before v2
    assert "episode_outbox" not in empty_backend.tables()
    db = await empty_backend.open()
    assert db.schema_version == len(MIGRATIONS)
    commit = commit_of(0)
    commit.episodes.append(episode("a"))
    await db.community("c").commit(commit)
    assert [e.id for e in await db.community("c").pending_episodes()] == ["a"]
    await db.close()
