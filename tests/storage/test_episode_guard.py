"""The episode guard: what keeps a forgotten member's episodes out of Chroma when
several processes write it (`storage.community.EpisodeGuard`, used by
`chroma_memory.write_behind.WriteBehindMemory`).

Two `Database` objects on one real PostgreSQL database stand for two processes: each
has its own coordination connection, so the advisory locks keep them apart as they
would two processes. Chroma is an in-process recorder shared by both (as the server
is); the point here is the order of the check, the write and the forget's delete.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from chroma_memory.write_behind import WriteBehindMemory
from sonality.store import SEMANTIC, Episode, Speaker
from storage import Database
from storage.community import EpisodeGuard
from storage.forget import MemberWords
from tests.engine.test_agent_learning import RecordingMemory

from .conftest import T0, Backend, ReusedDatabase, commit_of, episode, record

COMMUNITY = "slack:T1"
ADA = Speaker(id="u1", name="Ada")
BO = Speaker(id="u2", name="Bo")


async def learned(db: Database) -> None:
    """Ada's message i1 and Bo's i2 learned, with their episodes (and an insight) still
    waiting in the outbox, as a process leaves them before its batch is written."""
    store = db.community(COMMUNITY)
    await store.commit(commit_of(0))
    await store.record_interaction(record("i1").model_copy(update={"speaker": ADA}))
    await store.record_interaction(record("i2").model_copy(update={"speaker": BO}))
    first = commit_of(1, interaction_id="i1")
    first.episodes.append(episode("i1"))
    await store.commit(first)
    second = commit_of(2, interaction_id="i2")
    second.episodes.extend([episode("i2"), episode("insight-v2-0", memory_type=SEMANTIC)])
    await store.commit(second)


@pytest.fixture
def shared(migrated_database: ReusedDatabase, db_path: Path) -> Backend:
    """A PostgreSQL database, the only engine several processes share."""
    return Backend("postgresql", db_path, migrated_database.fresh())


def guard_of(db: Database) -> EpisodeGuard:
    guard = db.community(COMMUNITY).episode_guard()
    assert guard is not None
    return guard


async def test_one_process_alone_has_no_guard(backend: Backend) -> None:
    """SQLite (one process per file): nothing is checked or locked before a write."""
    db = await backend.open()
    try:
        guarded = db.community(COMMUNITY).episode_guard() is not None
        assert guarded == backend.postgres
    finally:
        await db.close()


async def test_only_episodes_still_waiting_and_not_being_forgotten_are_to_write(
    shared: Backend,
) -> None:
    db = await shared.open()
    try:
        await learned(db)
        guard = guard_of(db)
        everything = ["i1", "i2", "insight-v2-0", "never-committed"]
        assert await guard.still_to_write(everything) == {"i1", "i2", "insight-v2-0"}
        # Written by another process meanwhile: not written again.
        await db.community(COMMUNITY).mark_episodes_written(["i2"])
        assert await guard.still_to_write(everything) == {"i1", "insight-v2-0"}
        # Ada's forget-me is journaled: her episode is no longer to be written ...
        request = await db.begin_forget(COMMUNITY, ADA.id, ADA.id, "", T0)
        assert await guard.still_to_write(everything) == {"insight-v2-0"}
        # ... nor once her rows are gone and the request is closed.
        await db.erase_member(request, MemberWords(), T0)
        assert await guard.still_to_write(everything) == {"insight-v2-0"}
        # An insight drawn from her words, discarded by the forget-me (found by its text).
        await guard.discard(["insight-v2-0", "never-committed"])
        assert await guard.still_to_write(everything) == set()
    finally:
        await db.close()


class GatedChroma:
    """The shared Chroma of both processes, as seen by one of them: its writes stop
    at a gate, so a test can hold a batch between its check and its write."""

    def __init__(self, chroma: RecordingMemory) -> None:
        self.chroma = chroma
        self.entered = threading.Event()
        self.gate = threading.Event()

    def embed_many(self, texts: Sequence[str]) -> object:
        return self.chroma.embed_many(texts)

    def store_many(self, episodes: Sequence[Episode]) -> None:
        self.entered.set()
        self.gate.wait(60)
        self.chroma.store_many(episodes)

    def delete(self, ids: Sequence[str]) -> None:
        self.chroma.delete(ids)


class Watched:
    """A guard that says when the lock was refused (held by the other process)."""

    def __init__(self, inner: EpisodeGuard) -> None:
        self.inner = inner
        self.refused = asyncio.Event()

    async def acquire(self) -> bool:
        got = await self.inner.acquire()
        if not got:
            self.refused.set()
        return got

    async def release(self) -> None:
        await self.inner.release()

    async def still_to_write(self, episode_ids: Sequence[str]) -> set[str]:
        return await self.inner.still_to_write(episode_ids)

    async def discard(self, episode_ids: Sequence[str]) -> None:
        await self.inner.discard(episode_ids)


async def test_a_forget_waits_for_a_batch_checked_before_it_then_deletes_it(
    shared: Backend,
) -> None:
    """The race the lock closes: process b checked its batch (Ada not yet forgotten) and
    is writing it when process a's forget-me deletes Ada's episode. The delete must come
    after the write, or the write brings the episode back."""
    here, there = await shared.open(), await shared.open()
    chroma = RecordingMemory()
    gated = GatedChroma(chroma)
    b = WriteBehindMemory(gated, guard=guard_of(there), label="b")  # type: ignore[arg-type]
    watched = Watched(guard_of(here))
    a = WriteBehindMemory(chroma, guard=watched, label="a")
    try:
        await learned(there)
        pending = await there.community(COMMUNITY).pending_episodes()
        await b.start([], there.community(COMMUNITY).mark_episodes_written)
        b.unwritten.extend(e for e in pending if e.id == "i1")
        writing = asyncio.create_task(b.flush())
        await asyncio.to_thread(gated.entered.wait, 60)  # checked; in the middle of writing

        await here.begin_forget(COMMUNITY, ADA.id, ADA.id, "", T0)
        forgetting = asyncio.create_task(a.forget(["i1"]))
        refused = asyncio.create_task(watched.refused.wait())
        await asyncio.wait({forgetting, refused}, return_when=asyncio.FIRST_COMPLETED)
        gated.gate.set()
        await asyncio.gather(writing, forgetting)
        refused.cancel()
        assert chroma.writes and chroma.writes[0].id == "i1"  # b did write it ...
        assert "i1" not in chroma.by_id  # ... and a's delete came after
    finally:
        gated.gate.set()
        await b.close(5)
        await a.close(5)
        await here.close()
        await there.close()
